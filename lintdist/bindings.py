"""Which names a piece of code binds and reads, whether a name is bound again between two points, and whether
an expression can be evaluated once more without effect.

Names are dotted for attributes (``self.micro``), so that a fix which copies an expression elsewhere can tell
whether what it reads still means the same there.
"""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import PythonFacts

BINDERS = (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.For, cst.NamedExpr, cst.WithItem, cst.Del)
# Builtins without side effects: an expression calling only these gives the same value when evaluated again.
PURE_CALLS = frozenset({"len", "min", "max", "int", "bool", "abs"})


def bound_names(facts: PythonFacts, node: cst.CSTNode) -> set[str]:
    """The names (dotted for attributes) a binding statement or expression (one of ``BINDERS``) binds."""
    if isinstance(node, cst.Assign):
        targets = [t.target for t in node.targets]
    elif isinstance(node, (cst.AugAssign, cst.AnnAssign, cst.For, cst.NamedExpr)):
        targets = [node.target]
    elif isinstance(node, cst.WithItem):
        targets = [node.asname.name] if node.asname is not None else []
    else:
        targets = [t.value for t in node.target.elements] if isinstance(node.target, cst.Tuple) else [node.target]
    return {name for target in targets for name in read_names(facts, target)}


def read_names(facts: PythonFacts, expr: cst.CSTNode) -> set[str]:
    """The names and dotted attribute chains in ``expr`` (``self.micro`` gives ``self`` and ``self.micro``)."""
    return {key for node in facts.within(expr, cst.Name, cst.Attribute) if (key := get_full_name_for_node(node))}


def rebound_between(facts: PythonFacts, names: set[str], container: cst.CSTNode, start: int, stop: int) -> bool:
    """Whether code of ``container`` between the pre-order positions ``start`` (included) and ``stop`` binds one
    of ``names``; for ``self.`` attributes also inside the local functions called there."""
    order = facts.index.order
    for node in facts.within(container, *BINDERS):
        if start <= order(node) < stop and bound_names(facts, node) & names:
            return True
    attributes = {name for name in names if name.startswith("self.")}
    if attributes:
        for call in facts.within(container, cst.Call):
            if start <= order(call) < stop:
                for helper in facts.local_functions(call):
                    if any(bound_names(facts, node) & attributes for node in facts.within(helper, *BINDERS)):
                        return True
    return False


def repeatable(facts: PythonFacts, expr: cst.BaseExpression) -> bool:
    """Whether evaluating ``expr`` once more has no effect: no walrus, lambda, await or yield, and no call but
    the builtins of ``PURE_CALLS``."""
    if facts.within(expr, cst.NamedExpr, cst.Lambda, cst.Await, cst.Yield):
        return False
    return all(
        isinstance(call.func, cst.Name) and call.func.value in PURE_CALLS for call in facts.within(expr, cst.Call)
    )


def variable_names(facts: PythonFacts, expr: cst.CSTNode) -> set[str]:
    """The variables ``expr`` reads: every ``Name`` but the attribute names after a dot (``outputs.loss`` reads
    ``outputs``)."""
    attributes = {id(node.attr) for node in facts.within(expr, cst.Attribute)}
    return {node.value for node in facts.within(expr, cst.Name) if id(node) not in attributes}


def arithmetic(expr: cst.BaseExpression) -> bool:
    """Whether ``expr`` is names, attributes, subscripts by such, numbers and arithmetic on them only: it gives the
    same value later as long as nothing it names is rebound."""
    if isinstance(expr, (cst.Name, cst.Integer, cst.Float)):
        return True
    if isinstance(expr, cst.Attribute):
        return arithmetic(expr.value)
    if isinstance(expr, cst.Subscript):
        return arithmetic(expr.value) and all(
            isinstance(e.slice, cst.Index) and arithmetic(e.slice.value) for e in expr.slice
        )
    if isinstance(expr, cst.BinaryOperation):
        return arithmetic(expr.left) and arithmetic(expr.right)
    if isinstance(expr, cst.UnaryOperation):
        return arithmetic(expr.expression)
    return False


def rebinds_any(facts: PythonFacts, statement: cst.CSTNode, names: set[str]) -> bool:
    """Whether ``statement`` assigns one of ``names`` (or an attribute or item of one: ``self.loss = ...``
    changes what ``self.loss`` means later), changes one in place (``loss.mul_(2)``), or deletes anything."""

    def hits(target: cst.BaseExpression) -> bool:
        root = target
        while isinstance(root, (cst.Attribute, cst.Subscript)):
            root = root.value
        if isinstance(root, cst.Name) and root.value in names:
            return True
        if isinstance(target, (cst.Tuple, cst.List)):
            return any(hits(element.value) for element in target.elements)
        return isinstance(target, cst.StarredElement) and hits(target.value)

    kinds = (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.NamedExpr, cst.For, cst.AsName, cst.Del, cst.Call)
    for node in facts.within(statement, *kinds):
        if isinstance(node, cst.Del):
            return True
        if isinstance(node, cst.AsName):
            if hits(node.name):
                return True
        elif isinstance(node, cst.Call):
            func = node.func
            if isinstance(func, cst.Attribute) and func.attr.value.endswith("_"):
                root = func.value
                while isinstance(root, cst.Attribute):
                    root = root.value
                if isinstance(root, cst.Name) and root.value in names:
                    return True
        elif hits(node.target):
            return True
    return False


def attribute_assignments(facts: PythonFacts, attributes: tuple[str, ...]) -> list[cst.Assign]:
    """The single-target assignments ``x.<attribute> = value`` of this module to one of these attribute names (how
    scripts set fields of parsed arguments: ``training_args.ddp_find_unused_parameters = True``)."""
    return [
        assign
        for assign in facts.index.nodes(cst.Assign)
        if len(assign.targets) == 1
        and isinstance(target := assign.targets[0].target, cst.Attribute)
        and target.attr.value in attributes
    ]
