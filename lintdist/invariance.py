"""What a loop leaves alone: the names it rebinds, and whether an expression has one value in every pass."""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import Loop, PythonFacts


def assigned_keys(facts: PythonFacts, node: cst.CSTNode) -> set[str]:
    """The names and attributes (``x``, ``args.x``, and ``args`` of it) assigned inside ``node``, loop targets
    included."""
    keys: set[str] = set()
    for statement in facts.within(node, cst.Assign, cst.AugAssign, cst.AnnAssign, cst.For):
        targets = [t.target for t in statement.targets] if isinstance(statement, cst.Assign) else [statement.target]
        for target in targets:
            keys |= {get_full_name_for_node(part) or "" for part in facts.within(target, cst.Name, cst.Attribute)}
    return keys


def read_keys(facts: PythonFacts, expr: cst.BaseExpression) -> set[str]:
    """The whole names and attribute chains ``expr`` reads (``config.multi_gpu``, not ``config``)."""
    nodes = facts.within(expr, cst.Name, cst.Attribute)
    return {get_full_name_for_node(n) or "" for n in nodes if not isinstance(facts.parent(n), cst.Attribute)} - {""}


def same_each_pass(facts: PythonFacts, expr: cst.BaseExpression, loop: Loop) -> bool:
    """``expr`` has one value in every pass of ``loop``: it calls nothing and reads nothing the loop rebinds."""
    return not facts.within(expr, cst.Call) and not read_keys(facts, expr) & assigned_keys(facts, loop)


def rebound_in(facts: PythonFacts, key: str, loop: Loop, besides: cst.CSTNode) -> bool:
    """A statement of ``loop`` other than ``besides`` binds ``key``."""
    return any(b.statement is not besides and facts.is_within(b.statement, loop) for b in facts.bindings(key, loop))


def rebound_between(facts: PythonFacts, key: str, statement: cst.CSTNode, loop: Loop) -> bool:
    """Another statement binds ``key`` after ``statement`` and before ``loop`` in source order."""
    order = facts.index.order
    return any(
        b.statement is not statement and order(statement) < order(b.statement) < order(loop)
        for b in facts.bindings(key, loop)
    )


def range_start(loop: Loop, rebound: set[str]) -> tuple[str, cst.BaseExpression] | None:
    """``for epoch in range(start, ...)``: the counter and its first value, when that is a number or a name not in
    ``rebound`` (``range(n)`` starts at ``0``)."""
    if not isinstance(loop, cst.For) or not isinstance(loop.target, cst.Name) or not isinstance(loop.iter, cst.Call):
        return None
    call = loop.iter
    if get_full_name_for_node(call.func) != "range" or not call.args or any(a.keyword or a.star for a in call.args):
        return None
    start = call.args[0].value if len(call.args) > 1 else cst.Integer("0")
    if isinstance(start, cst.Integer) or (
        isinstance(start, (cst.Name, cst.Attribute)) and get_full_name_for_node(start) not in rebound
    ):
        return loop.target.value, start
    return None


def ancestors_inside(facts: PythonFacts, node: cst.CSTNode, container: cst.CSTNode) -> list[cst.CSTNode]:
    """The ancestors of ``node`` strictly inside ``container``, innermost first."""
    found = []
    for ancestor in facts.ancestors(node):
        if ancestor is container:
            break
        found.append(ancestor)
    return found


def fixed_name(facts: PythonFacts, expr: cst.BaseExpression, loop: Loop) -> str | None:
    """The name or attribute chain ``expr`` spells when no statement inside ``loop`` binds it (one value in every
    pass); None for another expression or a name the loop rebinds."""
    key = get_full_name_for_node(expr) if isinstance(expr, (cst.Name, cst.Attribute)) else None
    if key is None or any(facts.is_within(b.statement, loop) for b in facts.bindings(key, loop)):
        return None
    return key
