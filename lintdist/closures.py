"""Which names a function or lambda reads from outside itself (its free variables), and where.

A schedule function (``lambda step: 1 - step / total``), a callback or a ``partial`` target takes part of its
behaviour from the names it closes over; a question about that behaviour starts from those reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts


def free_reads(facts: PythonFacts, definition: cst.FunctionDef | cst.Lambda) -> dict[str, list[cst.Name]]:
    """The variable reads in ``definition``'s body of names it does not bind (not a parameter, an assignment or
    loop target of its own, nor an import), by name in the order first read; names only called are left out."""
    bound = parameter_names(definition.params) | assigned_names(facts, definition)
    reads: dict[str, list[cst.Name]] = {}
    for name in facts.within(definition.body, cst.Name):
        if not facts.is_variable(name) or name.value in bound or name.value in facts.imported_names:
            continue
        parent = facts.parent(name)
        if isinstance(parent, cst.Call) and parent.func is name:
            continue
        reads.setdefault(name.value, []).append(name)
    return reads


def parameter_names(params: cst.Parameters) -> set[str]:
    """Every name a parameter list binds, ``*args`` and ``**kwargs`` included."""
    every = [*params.posonly_params, *params.params, *params.kwonly_params]
    every += [p for p in (params.star_arg, params.star_kwarg) if isinstance(p, cst.Param)]
    return {p.name.value for p in every}


def assigned_names(facts: PythonFacts, definition: cst.CSTNode) -> set[str]:
    """The plain names assigned (``=``, ``+=``, annotated) or used as ``for`` targets anywhere in ``definition``."""
    names = set()
    for statement in facts.within(definition, cst.Assign, cst.AugAssign, cst.AnnAssign):
        targets = [t.target for t in statement.targets] if isinstance(statement, cst.Assign) else [statement.target]
        for target in targets:
            names |= {n.value for n in facts.within(target, cst.Name)}
    for loop in facts.within(definition, cst.For):
        names |= {n.value for n in facts.within(loop.target, cst.Name)}
    return names
