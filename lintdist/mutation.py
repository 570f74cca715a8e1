"""Whether a block changes what a name holds: rebinds it, or mutates it or a value taken from it in place."""

from __future__ import annotations

import libcst as cst

from lintdist.facts import PythonFacts

# dict methods that change a mapping in place
DICT_MUTATORS = frozenset({"pop", "popitem", "update", "setdefault", "clear", "__setitem__", "__delitem__"})


def changes(facts: PythonFacts, body: cst.CSTNode, name: str) -> bool:
    """Whether ``body`` rebinds ``name``, stores into it or into a value assigned from it (``x = batch;
    x["k"] = v``), or calls an in-place method on them (``batch.pop(...)``, ``t.add_(...)``)."""
    roots = {name} | {
        bound.value
        for assign in facts.within(body, cst.Assign)
        if any(read.value == name for read in facts.within(assign.value, cst.Name))
        for target in assign.targets
        for bound in facts.within(target.target, cst.Name)
    }
    written = [n.target for n in facts.within(body, cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.Del)]
    written += [n.target for n in facts.within(body, cst.NamedExpr, cst.For)]
    targets = [t for target in written for t in unpacked(target)]
    if any(root_name(t) == name or (root_name(t) in roots and not isinstance(t, cst.Name)) for t in targets):
        return True
    return any(
        root_name(call.func.value) in roots
        and (call.func.attr.value in DICT_MUTATORS or call.func.attr.value.endswith("_"))
        for call in facts.within(body, cst.Call)
        if isinstance(call.func, cst.Attribute)
    )


def unpacked(target: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The single targets of an assignment target (``a, (b, *c)`` -> a, b, c)."""
    if isinstance(target, (cst.Tuple, cst.List)):
        return [t for element in target.elements for t in unpacked(element.value)]
    if isinstance(target, cst.StarredElement):
        return unpacked(target.value)
    return [target]


def root_name(expr: cst.BaseExpression) -> str | None:
    """The name an expression starts from (``batch`` of ``batch["x"].y(...)``), None when it is not a name."""
    while isinstance(expr, (cst.Subscript, cst.Attribute, cst.Call)):
        expr = expr.func if isinstance(expr, cst.Call) else expr.value
    return expr.value if isinstance(expr, cst.Name) else None
