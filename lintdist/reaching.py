"""Which assignments of a name may give its value at a point, and whether a caller's argument does.

``facts.bindings`` lists every assignment visible from a point; a question about the value a name holds *there*
needs the ones that may still be in force: the last assignment before the point in the same function, and the
ones before it while it is conditional (inside an ``if``, a loop or a handler that the point is not in).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
from libcst.helpers import get_full_name_for_node

if TYPE_CHECKING:
    from lintdist.facts import Binding, PythonFacts

SCOPES = (cst.FunctionDef, cst.Lambda, cst.ClassDef, cst.Module)
BRANCHES = (cst.If, cst.For, cst.While, cst.ExceptHandler)


def reaching_bindings(facts: PythonFacts, key: str, at: cst.CSTNode) -> tuple[list[Binding], bool]:
    """The assignments to ``key`` that may give its value at ``at``, and whether its value from before them (an
    argument, a parsed option, an attribute set elsewhere) may reach ``at`` too."""
    order = facts.index.order
    function = facts.enclosing_function(at)
    found = facts.bindings(key, at)
    same = [b for b in found if b.function is function]
    if not same:
        return found, False
    before = sorted((b for b in same if 0 <= order(b.statement) < order(at)), key=lambda b: -order(b.statement))
    if not before:
        # assigned only later (or in other methods of the class): an attribute set elsewhere
        others = [b for b in found if b.function is not function]
        return others, not others
    chosen: list[Binding] = []
    for binding in before:
        if facts.exclusive(binding.statement, at):
            continue
        chosen.append(binding)
        if not conditional_for(facts, binding.statement, at):
            return chosen, False
    return chosen, True


def conditional_for(facts: PythonFacts, statement: cst.CSTNode, at: cst.CSTNode) -> bool:
    """``statement`` may not run on the way to ``at``: it sits in a branch, loop or handler that ``at`` is not in
    (within their common function)."""
    for ancestor in facts.ancestors(statement):
        if isinstance(ancestor, SCOPES):
            return False
        if isinstance(ancestor, BRANCHES) and not facts.is_within(at, ancestor):
            return True
    return False


def reads_passed_parameter(facts: PythonFacts, expr: cst.BaseExpression, at: cst.CSTNode) -> bool:
    """``expr`` reads a parameter (never reassigned) of a function that this file calls: its value is whatever the
    call sites pass."""
    for name in facts.within(expr, cst.Name):
        if isinstance(facts.parent(name), cst.Attribute) or name.value in {"self", "cls"}:
            continue
        found = facts.parameter(name.value, at)
        if found is not None and not facts.bindings(name.value, at) and facts.call_sites(found[0]):
            return True
    return False


def filled_when_missing(facts: PythonFacts, key: str, at: cst.CSTNode) -> tuple[Binding, cst.If] | None:
    """The one assignment to ``key`` that may reach ``at`` besides its value from before, when it fills in a value
    that was not given: a line of an ``if key is None:`` (or ``if not key:``) without ``else``, in ``at``'s
    function (``if args.max_train_steps is None: args.max_train_steps = ...``); the binding and the ``if``."""
    bindings, falls_through = reaching_bindings(facts, key, at)
    if not falls_through or len(bindings) != 1:
        return None
    (binding,) = bindings
    line = facts.parent(binding.statement)
    branch = facts.parent(facts.parent(line))
    if (
        not isinstance(line, cst.SimpleStatementLine)
        or not isinstance(branch, cst.If)
        or branch.orelse is not None
        or not _tests_missing(branch.test, key)
        or facts.enclosing_function(branch) is not facts.enclosing_function(at)
    ):
        return None
    return binding, branch


def _tests_missing(test: cst.BaseExpression, key: str) -> bool:
    """``key is None`` or ``not key``."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return get_full_name_for_node(test.expression) == key
    return (
        isinstance(test, cst.Comparison)
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, cst.Is)
        and get_full_name_for_node(test.comparisons[0].comparator) == "None"
        and get_full_name_for_node(test.left) == key
    )


def divided_later(facts: PythonFacts, key: str, at: cst.CSTNode) -> list[tuple[cst.BaseExpression, cst.CSTNode]]:
    """After ``at`` in source order, the divisors ``key`` is rebound to itself over (``steps = steps // k``,
    ``args.steps = math.ceil(args.steps / k)``), each with its assignment."""
    order = facts.index.order
    return [
        (operation.right, binding.statement)
        for binding in facts.bindings(key, at)
        if order(binding.statement) > order(at)
        for operation in facts.within(binding.value, cst.BinaryOperation)
        if isinstance(operation.operator, (cst.Divide, cst.FloorDivide))
        and get_full_name_for_node(operation.left) == key
    ]
