"""How a script spells an object at a point, so that a fix writes it the way the script already does.

A fix that calls the Accelerator or ``torch.distributed`` has to name them with an expression that is bound where the
fix lands: ``self.accelerator`` in a method, ``accelerator`` in ``main()``, ``dist`` after ``import
torch.distributed as dist``. The answers come from the facts' indexes (no walk of their own); ``PythonFacts``
exposes them as ``accelerator_at`` and ``distributed_at``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
from libcst.helpers import get_full_name_for_node

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts

# Attributes whose use on a receiver (confirmed by ``facts.is_accelerator``) shows an Accelerator the code names.
ACCELERATOR_ATTRIBUTES = frozenset(
    {"prepare", "backward", "wait_for_everyone", "save", "save_state", "load_state", "unwrap_model", "print"}
    | {"gather", "gather_for_metrics", "get_state_dict", "save_model", "accumulate", "clip_grad_norm_", "log"}
    | {"is_main_process", "is_local_main_process", "num_processes"}
    | {"no_sync", "autocast", "reduce", "pad_across_processes", "end_training", "free_memory", "sync_gradients"}
)
DISTRIBUTED = "torch.distributed"


def accelerator_at(facts: PythonFacts, at: cst.CSTNode) -> str | None:
    """Source text naming an Accelerator that is bound where ``at`` is, None when none is in sight.

    In order: a receiver the same function (or, at module level, the module's own code) already uses as an
    Accelerator; in a method, ``self.<x>`` set to ``Accelerator(...)`` in the class; a module-level name bound to
    ``Accelerator(...)`` or used as one at module level, unless the function rebinds it."""
    function = facts.enclosing_function(at)
    own = _accelerator_used(facts, function, dotted=True)
    if own is not None:
        return own
    if function is not None and _is_method(facts, function):
        cls = facts.enclosing_class(function)
        for call in facts.accelerator_constructions:
            name = _assigned_name(facts, call)
            if name and name.startswith("self.") and name.count(".") == 1 and facts.enclosing_class(call) is cls:
                return name
    for call in facts.accelerator_constructions:
        name = _assigned_name(facts, call)
        if name and "." not in name and facts.enclosing_function(call) is None and _module_name_visible(facts, name, at):
            return name
    if function is None:
        return None
    name = _accelerator_used(facts, None, dotted=False)
    return name if name is not None and _module_name_visible(facts, name, at) else None


def distributed_at(facts: PythonFacts, at: cst.CSTNode | None = None) -> str | None:
    """How the script spells ``torch.distributed`` where ``at`` is (anywhere at module level when ``at`` is None).

    ``dist`` of ``import torch.distributed as dist`` or ``from torch import distributed as dist``, wherever it stands
    among the imports; else ``torch.distributed`` (``th.distributed``) after ``import torch`` (``as th``) or ``import
    torch.<any>``; ``dist`` read unbound in a snippet (its conventional meaning); None when nothing imports torch.
    Imports inside a function count only where ``at`` is inside that function."""
    through_torch = None
    for statement in facts.index.nodes(cst.Import, cst.ImportFrom):
        if isinstance(statement.names, cst.ImportStar) or not _in_sight(facts, statement, at):
            continue
        for alias in statement.names:
            full = get_full_name_for_node(alias.name) or ""
            bound = get_full_name_for_node(alias.asname.name) if alias.asname is not None else None
            if isinstance(statement, cst.Import):
                if full == DISTRIBUTED and bound:
                    return bound
                if full == "torch" and bound:
                    through_torch = through_torch or f"{bound}.distributed"
                elif full == "torch" or full.startswith("torch."):
                    through_torch = through_torch or DISTRIBUTED
            elif statement.module is not None and get_full_name_for_node(statement.module) == "torch":
                if full == "distributed":
                    return bound or "distributed"
    return through_torch or facts.conventional_spelling(DISTRIBUTED)


def _accelerator_used(facts: PythonFacts, function: cst.FunctionDef | None, *, dotted: bool) -> str | None:
    """The first receiver of an Accelerator attribute in ``function``'s own code (the module's, for None)."""
    scope = function if function is not None else facts.index.module
    for attribute in facts.within(scope, cst.Attribute):
        if attribute.attr.value not in ACCELERATOR_ATTRIBUTES or facts.enclosing_function(attribute) is not function:
            continue
        receiver = attribute.value
        if not isinstance(receiver, (cst.Name, cst.Attribute)) or (not dotted and not isinstance(receiver, cst.Name)):
            continue
        text = get_full_name_for_node(receiver)
        if text is not None and facts.is_accelerator(receiver, attribute):
            return text
    return None


def _assigned_name(facts: PythonFacts, call: cst.Call) -> str | None:
    """``x`` of ``x = call`` (``self.x`` too); None for any other use of the call."""
    assign = facts.parent(call)
    if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
        return None
    return get_full_name_for_node(assign.targets[0].target)


def _is_method(facts: PythonFacts, function: cst.FunctionDef) -> bool:
    """``function``, or a function it is nested in, is a method taking ``self``: the instance is in sight."""
    outer: cst.FunctionDef | None = function
    while outer is not None:
        params = outer.params.params
        if params and params[0].name.value == "self" and facts.enclosing_class(outer) is not None:
            return True
        outer = facts.enclosing_function(outer)
    return False


def _module_name_visible(facts: PythonFacts, name: str, at: cst.CSTNode) -> bool:
    """A module-level ``name`` is what ``name`` means at ``at``: the function there does not bind it itself."""
    return all(b.function is None for b in facts.bindings(name, at))


def _in_sight(facts: PythonFacts, node: cst.CSTNode, at: cst.CSTNode | None) -> bool:
    """``node`` is at module level, or in a function that ``at`` is inside."""
    function = facts.enclosing_function(node)
    return function is None or (at is not None and facts.is_within(at, function))


def class_spelling(
    facts: PythonFacts, classes: frozenset[str], modules: frozenset[str], home: str
) -> tuple[str | None, tuple[tuple[str, str], ...]]:
    """How module-level code names a class (one of the qualified ``classes``, exported by each of ``modules``),
    and the import a fix must add: a module-level import of it or of its module (aliases kept), a dotted use
    already there, else its bare name imported from ``home``; ``(None, ())`` when a name of the script's own is
    in the way."""
    name = next(iter(classes)).rsplit(".", 1)[-1]
    names = facts.names
    for statement in facts.index.nodes(cst.ImportFrom):
        if not _module_level(facts, statement) or statement.module is None:
            continue
        if isinstance(statement.names, cst.ImportStar):
            continue
        module = get_full_name_for_node(statement.module)
        for alias in statement.names:
            if f"{module}.{get_full_name_for_node(alias.name)}" in classes:
                return get_full_name_for_node(alias.asname.name if alias.asname is not None else alias.name), ()
    for statement in facts.index.nodes(cst.Import):  # `import torch.utils.data as tud`
        if not _module_level(facts, statement):
            continue
        for alias in statement.names:
            module = get_full_name_for_node(alias.name)
            if module in modules:
                local = get_full_name_for_node(alias.asname.name) if alias.asname is not None else module
                return f"{local}.{name}", ()
    for attribute in facts.index.nodes(cst.Attribute):  # `torch.utils.data.distributed.DistributedSampler`
        known = attribute.attr.value == name and not classes.isdisjoint(facts.qualified_names(attribute))
        if known and names.module_bindings(get_full_name_for_node(attribute).split(".", 1)[0]):
            return facts.index.module.code_for_node(attribute), ()
    taken = any(n.value == name and facts.is_variable(n) for n in facts.index.nodes(cst.Name))
    if names.module_bindings(name) or taken:
        return None, ()
    return name, ((home, name),)


def _module_level(facts: PythonFacts, statement: cst.CSTNode) -> bool:
    return facts.enclosing_function(statement) is None and facts.enclosing_class(statement) is None


def unused_name(facts: PythonFacts, scope: cst.CSTNode, candidates: tuple[str, ...]) -> str | None:
    """The first of ``candidates`` that no name in ``scope`` spells, for a variable a fix adds; None if all are."""
    used = {name.value for name in facts.within(scope, cst.Name)}
    return next((c for c in candidates if c not in used), None)


def imported_name(facts: PythonFacts, qualified: frozenset[str], fallback: tuple[str, str]) -> tuple[str | None, tuple]:
    """How a fix names a class: (the module-level name an import binds to one of ``qualified``, alias kept, ()),
    else (``fallback``'s name, (``fallback``,)) to import it when that name is free, else (None, ())."""
    names = facts.names
    for statement in facts.index.nodes(cst.ImportFrom):
        if isinstance(statement.names, cst.ImportStar) or statement.relative:
            continue
        module = get_full_name_for_node(statement.module) or ""
        for alias in statement.names:
            imported = f"{module}.{get_full_name_for_node(alias.name)}"
            bound = get_full_name_for_node(alias.asname.name if alias.asname else alias.name) or ""
            bindings = names.module_bindings(bound)
            if imported in qualified and bindings and all(b.node is statement for b in bindings):
                return bound, ()
    if names.module_bindings(fallback[1]):
        return None, ()
    return fallback[1], (fallback,)


def main_process_test(facts: PythonFacts, at: cst.CSTNode, accelerator: str | None = None) -> str | None:
    """A test true on the main process only, as the script would spell it where ``at`` is: its Accelerator's
    ``is_main_process`` (``accelerator``, when the caller knows it), else rank 0 of ``torch.distributed`` (or no
    process group at all); None when neither is in sight."""
    accelerator = accelerator or accelerator_at(facts, at)
    if accelerator is not None:
        return f"{accelerator}.is_main_process"
    alias = distributed_at(facts, at)
    return f"not {alias}.is_initialized() or {alias}.get_rank() == 0" if alias is not None else None


def variable_spelled(facts: PythonFacts, name: str) -> bool:
    """Some module-level or local name of the file is spelled ``name`` (read or bound, a function's name included):
    a name a fix imports would shadow it or be shadowed. Attributes, keywords and methods do not count."""
    for node in facts.index.nodes(cst.Name):
        if node.value != name or not facts.is_variable(node):
            continue
        parent = facts.parent(node)
        if not (isinstance(parent, cst.FunctionDef) and parent.name is node):
            return True
        body = facts.parent(parent)  # a method: a function of a class body
        if not (body is not None and isinstance(facts.parent(body), cst.ClassDef)):
            return True
    return False


def name_taken(facts: PythonFacts, name: str, imported_from: frozenset[str] = frozenset()) -> bool:
    """``name`` is bound anywhere in the file (an assignment, a parameter, a ``from`` import, a ``def`` or a class),
    other than by ``from <one of imported_from> import <name>``: a fix cannot add a binding of that name."""
    if facts._bindings.get(name) or any(p.name.value == name for p in facts.index.nodes(cst.Param)):
        return True
    for statement in facts.index.nodes(cst.ImportFrom):
        if isinstance(statement.names, cst.ImportStar):
            continue
        module = get_full_name_for_node(statement.module) if statement.module is not None else ""
        for alias in statement.names:
            bound = alias.asname.name if alias.asname is not None else alias.name
            if get_full_name_for_node(bound) == name and module not in imported_from:
                return True
    return bool(facts.functions.get(name)) or name in {c.name.value for c in facts.classes}


def binding_import(facts: PythonFacts, name: str) -> cst.Import | cst.ImportFrom | None:
    """The first import statement of the file that binds ``name`` (``import a.b as name``, ``from m import
    name``); None when no import binds it."""
    for statement in facts.index.nodes(cst.Import, cst.ImportFrom):
        if isinstance(statement.names, cst.ImportStar):
            continue
        for alias in statement.names:
            bound = alias.asname.name if alias.asname is not None else alias.name
            if isinstance(bound, cst.Name) and bound.value == name:
                return statement
    return None


def import_reads(facts: PythonFacts, statement: cst.Import | cst.ImportFrom) -> list[cst.Name]:
    """The reads of the names an import statement binds, outside it (not ``x.<name>`` nor a keyword ``<name>=``)."""
    if isinstance(statement.names, cst.ImportStar):
        return []
    bound = {get_full_name_for_node(a.asname.name if a.asname is not None else a.name) for a in statement.names}
    return [
        name
        for name in facts.index.nodes(cst.Name)
        if name.value in bound and not facts.is_within(name, statement) and facts.is_variable(name)
    ]
