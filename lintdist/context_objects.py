"""The object a ``with`` item enters: the construction it comes from, the names it goes by, and whether the block
calls a method of it or hands it to code out of sight."""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import PythonFacts


def entered_construction(
    facts: PythonFacts, item: cst.WithItem, at: cst.CSTNode, classes: frozenset[str]
) -> cst.Call | None:
    """The construction of one of ``classes`` that ``item`` enters: written there, or the one every value of the
    name it names comes from."""
    expr = item.item
    if isinstance(expr, cst.Call):
        return expr if facts.is_instance_of(expr, classes) else None
    if isinstance(expr, (cst.Name, cst.Attribute)):
        origins = facts.origins(expr, at)
        calls = [o.node for o in origins if isinstance(o.node, cst.Call) and o.index is None]
        found = [c for c in calls if facts.is_instance_of(c, classes)]
        if found and len(found) == len(origins):
            return found[0]
    return None


def entered_names(item: cst.WithItem) -> set[str] | None:
    """The full names the entered object goes by in the block: the ``as`` name and the name entered; None for
    ``as (a, b)``, which binds no one object."""
    target = item.asname.name if item.asname is not None else None
    if target is not None and not isinstance(target, cst.Name):
        return None
    names = {target.value} if target is not None else set()
    if isinstance(item.item, (cst.Name, cst.Attribute)):
        names.add(get_full_name_for_node(item.item) or "")
    names.discard("")
    return names


def refers_to(facts: PythonFacts, expr: cst.BaseExpression, at: cst.CSTNode, made: cst.Call, names: set[str]) -> bool:
    """``expr`` can be the object ``made`` constructs: it is spelled as one of ``names``, or a value it comes from
    is ``made`` or spelled so."""
    if not isinstance(expr, (cst.Name, cst.Attribute)):
        return False
    if (get_full_name_for_node(expr) or "") in names:
        return True
    return any(
        origin.node is made
        or isinstance(origin.node, (cst.Name, cst.Attribute))
        and get_full_name_for_node(origin.node) in names
        for origin in facts.origins(expr, at)
    )


def method_called_or_escapes(
    facts: PythonFacts, with_node: cst.With, made: cst.Call, names: set[str], method: str
) -> bool:
    """The block calls ``method`` of the object (also in a helper of this file), or hands the object to code out of
    sight: an argument of a call that is not this file's, or a value stored in an attribute or container."""
    for inner in facts.reachable_calls(with_node.body):
        func = inner.func
        if (
            isinstance(func, cst.Attribute)
            and func.attr.value == method
            and refers_to(facts, func.value, inner, made, names)
        ):
            return True
        if facts.local_functions(inner):
            continue  # a helper of this file: its own calls are among the reachable ones
        if any(refers_to(facts, arg.value, inner, made, names) for arg in inner.args):
            return True  # `run_epoch(..., local_sgd)` of another module, `hooks.append(local_sgd)`...
    return any(
        refers_to(facts, assign.value, assign, made, names)
        and not all(isinstance(t.target, cst.Name) for t in assign.targets)
        for assign in facts.within(with_node.body, cst.Assign)
    )
