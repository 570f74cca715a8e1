"""Branches that never run: a test that the file's constants make false (``num_gpus = 1`` ... ``if num_gpus > 1:``)."""

from __future__ import annotations

import operator

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import PythonFacts

COMPARE = {
    cst.GreaterThan: operator.gt,
    cst.GreaterThanEqual: operator.ge,
    cst.LessThan: operator.lt,
    cst.LessThanEqual: operator.le,
    cst.Equal: operator.eq,
    cst.NotEqual: operator.ne,
}


def never_runs(facts: PythonFacts, node: cst.CSTNode) -> cst.If | None:
    """The ``if`` whose body holds ``node`` and whose test the file's constants make false, or None."""
    child = node
    for ancestor in facts.ancestors(node):
        if isinstance(ancestor, cst.If) and child is ancestor.body and surely_false(facts, ancestor.test):
            return ancestor
        child = ancestor
    return None


def surely_false(facts: PythonFacts, test: cst.BaseExpression) -> bool:
    """``test`` is false whatever runs: ``False``, a comparison of constants, or an ``and`` with such a side."""
    if isinstance(test, cst.BooleanOperation):
        if isinstance(test.operator, cst.And):
            return surely_false(facts, test.left) or surely_false(facts, test.right)
        return surely_false(facts, test.left) and surely_false(facts, test.right)
    if isinstance(test, cst.Name) and test.value == "False":
        return True
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        compare = COMPARE.get(type(test.comparisons[0].operator))
        left = constant_int(facts, test.left, test)
        right = constant_int(facts, test.comparisons[0].comparator, test)
        return compare is not None and left is not None and right is not None and not compare(left, right)
    return False


def constant_int(facts: PythonFacts, expr: cst.BaseExpression, at: cst.CSTNode) -> int | None:
    """An integer literal, or a name every binding of which in sight is one and the same integer literal, which no
    augmented assignment or ``global`` statement of the file changes."""
    if isinstance(expr, cst.Integer):
        return int(expr.evaluated_value)
    if not isinstance(expr, cst.Name):
        return None
    origins = facts.origins(expr, at)
    values = {int(o.node.evaluated_value) for o in origins if isinstance(o.node, cst.Integer) and o.index is None}
    if not origins or len(values) != 1 or len(origins) != sum(isinstance(o.node, cst.Integer) for o in origins):
        return None
    name = expr.value
    for augmented in facts.index.nodes(cst.AugAssign):
        if get_full_name_for_node(augmented.target) == name:
            return None
    for statement in facts.index.nodes(cst.Global):
        if any(item.name.value == name for item in statement.names):
            return None
    return values.pop()


def conditional_within(facts: PythonFacts, node: cst.CSTNode, within: cst.CSTNode) -> bool:
    """``node`` sits under an ``if``, ``while``, conditional expression or ``try`` inside ``within``: it may not run
    whenever ``within`` does."""
    for ancestor in facts.ancestors(node):
        if ancestor is within:
            return False
        if isinstance(ancestor, (cst.If, cst.While, cst.IfExp, cst.Try)):
            return True
    return False
