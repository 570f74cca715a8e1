"""Whether code runs only under a condition of some kind (about the backend, about the mesh...): inside a branch on
one, after an early exit or an ``assert`` on one, after a helper that stops the run on one, or in a function whose
every caller is so guarded. The kind is a pattern over the words of the condition."""

from __future__ import annotations

import re
from collections.abc import Callable

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import PythonFacts

MAX_NAME_DEPTH = 3  # how many `a = ...; b = a and ...` steps a condition is followed back
EXIT_CALLS = frozenset({"sys.exit", "exit", "quit", "os._exit"})


def condition_words(facts: PythonFacts, expr: cst.CSTNode) -> list[str]:
    """The names, attribute names and strings written in an expression."""
    return [node.value for node in facts.within(expr, cst.Name, cst.SimpleString)]


def mentions(facts: PythonFacts, test: cst.BaseExpression, pattern: re.Pattern[str], depth: int = 0) -> bool:
    """Whether a condition has a word ``pattern`` matches, directly or through names bound to such an expression
    (``use_ddp = accelerator.distributed_type == DistributedType.MULTI_GPU``); ``args.x`` is judged by its words."""
    if any(pattern.search(word) for word in condition_words(facts, test)):
        return True
    if depth >= MAX_NAME_DEPTH:
        return False
    inside = {id(n) for attribute in facts.within(test, cst.Attribute) for n in facts.within(attribute, cst.Name)}
    names = [test] if isinstance(test, cst.Name) else [n for n in facts.within(test, cst.Name) if id(n) not in inside]
    return any(
        mentions(facts, binding.value, pattern, depth + 1)
        for name in names
        for binding in facts.bindings(name.value, test)
    )


def stops(body: cst.BaseSuite, returns: bool = True) -> bool:
    """Whether a block stops the run (``raise``, ``sys.exit(...)``) or, when ``returns``, leaves the function."""
    statements = body.body if isinstance(body, cst.IndentedBlock) else [body]
    for statement in statements:
        smalls = statement.body if isinstance(statement, (cst.SimpleStatementLine, cst.SimpleStatementSuite)) else ()
        for small in smalls:
            if isinstance(small, cst.Raise) or (returns and isinstance(small, cst.Return)):
                return True
            call = small.value if isinstance(small, cst.Expr) else None
            if isinstance(call, cst.Call) and (get_full_name_for_node(call.func) or "") in EXIT_CALLS:
                return True
    return False


def guarded_by(
    facts: PythonFacts, node: cst.CSTNode, pattern: re.Pattern[str], line: Callable[[cst.CSTNode], int], depth: int
) -> bool:
    """Whether ``node`` runs only under a condition ``pattern`` recognises: in a branch on it, after an early exit,
    an ``assert`` or a helper call (one that raises on it) earlier in its function, or in a function all of whose
    callers are guarded, through up to ``depth`` levels. ``line(node)`` gives a node's line."""
    child = node
    for ancestor in facts.ancestors(node):
        conditional = isinstance(ancestor, (cst.If, cst.While, cst.IfExp))
        if conditional and child is not ancestor.test and mentions(facts, ancestor.test, pattern):
            return True
        child = ancestor
    function = facts.enclosing_function(node)
    at = line(node)

    def before(other: cst.CSTNode) -> bool:
        return facts.enclosing_function(other) is function and line(other) < at and not facts.is_within(node, other)

    if any(before(branch) and _exits_on(facts, branch, pattern, returns=True) for branch in facts.index.nodes(cst.If)):
        return True
    if any(before(check) and mentions(facts, check.test, pattern) for check in facts.index.nodes(cst.Assert)):
        return True
    for call in facts.calls:  # `ensure_ddp(accelerator)` first: a helper that raises on the wrong backend
        if not before(call) or not isinstance(facts.parent(call), cst.Expr):
            continue
        if any(_helper_checks(facts, helper, pattern) for helper in facts.local_functions(call)):
            return True
    if function is None or depth <= 0:
        return False
    sites = facts.call_sites(function)
    return bool(sites) and all(guarded_by(facts, site, pattern, line, depth - 1) for site in sites)


def _exits_on(facts: PythonFacts, branch: cst.If, pattern: re.Pattern[str], returns: bool) -> bool:
    return mentions(facts, branch.test, pattern) and stops(branch.body, returns)


def _helper_checks(facts: PythonFacts, helper: cst.FunctionDef, pattern: re.Pattern[str]) -> bool:
    """The helper stops the run on such a condition (``raise`` under an ``if``, or an ``assert``); a ``return``
    only leaves the helper."""
    return any(
        facts.enclosing_function(branch) is helper and _exits_on(facts, branch, pattern, returns=False)
        for branch in facts.index.nodes(cst.If)
    ) or any(
        facts.enclosing_function(check) is helper and mentions(facts, check.test, pattern)
        for check in facts.index.nodes(cst.Assert)
    )


def branch_tests(facts: PythonFacts, node: cst.CSTNode) -> list[cst.BaseExpression]:
    """The tests of the ``if``/``while``/conditional expressions ``node`` sits in a branch of, within its function
    (innermost first; not a test ``node`` is part of): what decides whether ``node`` runs or is chosen."""
    tests, child = [], node
    for ancestor in facts.ancestors(node):
        if isinstance(ancestor, (cst.FunctionDef, cst.Lambda)):
            break
        if isinstance(ancestor, (cst.If, cst.While, cst.IfExp)) and child is not ancestor.test:
            tests.append(ancestor.test)
        child = ancestor
    return tests
