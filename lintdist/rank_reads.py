"""Whether code reads the process's rank in any form, for the tests ``facts.rank_guard`` does not parse.

``reads_rank`` looks for a rank name, a rank getter or a ``"RANK"`` string in an expression and in what the names it
reads were bound to (two levels deep); ``rank_tested`` finds an ``if``/``while`` on such a test around a node, or
around every call of its function in this file (``if args.rank % ngpus_per_node == 0: save_checkpoint(...)``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from lintdist.callgraph import registered
from lintdist.facts import RANK_GETTERS, RANK_NAMES

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts

MAX_BINDING_DEPTH = 2
MAX_CALLER_DEPTH = 3


def reads_rank(facts: PythonFacts, expr: cst.BaseExpression | None, at: cst.CSTNode, depth: int = 0) -> bool:
    """``expr`` reads the process's rank: a rank name, a rank getter, a string holding ``RANK``, or a name bound
    (up to ``MAX_BINDING_DEPTH`` levels) to such."""
    if expr is None:
        return False
    for node in [expr, *facts.within(expr, cst.Name, cst.Attribute, cst.Call, cst.SimpleString)]:
        if isinstance(node, cst.Name) and node.value in RANK_NAMES:
            return True
        if isinstance(node, cst.Attribute) and node.attr.value in RANK_NAMES:
            return True
        if isinstance(node, cst.Call) and (
            facts.method_name(node) in RANK_GETTERS
            or (isinstance(node.func, cst.Name) and node.func.value in RANK_GETTERS)
        ):
            return True
        if isinstance(node, cst.SimpleString) and "RANK" in node.value:
            return True
    if depth >= MAX_BINDING_DEPTH:
        return False
    names = {id(n): n for n in [expr, *facts.within(expr, cst.Name)] if isinstance(n, cst.Name)}
    return any(
        binding.value is not expr and reads_rank(facts, binding.value, binding.statement, depth + 1)
        for name in names.values()
        for binding in facts.bindings(name.value, at)
    )


def rank_tested(facts: PythonFacts, node: cst.CSTNode, depth: int = 0) -> bool:
    """An ``if``/``while`` whose test reads the rank (its own names only, ``reads_rank`` without following bindings)
    stands around ``node`` in its function, or around every call of its function in this file (up to
    ``MAX_CALLER_DEPTH`` levels)."""
    child = node
    for ancestor in facts.ancestors(node):
        if (
            isinstance(ancestor, (cst.If, cst.While))
            and child is not ancestor.test
            and reads_rank(facts, ancestor.test, ancestor, depth=MAX_BINDING_DEPTH)
        ):
            return True
        if isinstance(ancestor, cst.FunctionDef):
            sites = facts.call_sites(ancestor)
            return depth < MAX_CALLER_DEPTH and bool(sites) and all(rank_tested(facts, s, depth + 1) for s in sites)
        child = ancestor
    return False


def every_rank_callers(facts: PythonFacts, node: cst.CSTNode) -> list[tuple[PythonFacts, cst.Call]] | None:
    """None unless every process of a distributed run reaches ``node``: no rank test stands around it, in its
    function or its callers', and it is not in a hook handed to a ``register_*`` call (whoever fires it decides
    where it runs). Else the calls in other modules that set up the run it is in (``main.py`` builds the DDP model
    and calls ``checkpoint.save(...)``), or none where this module sets up the processes itself."""
    function = facts.enclosing_function(node)
    if function is not None and registered(facts, function):
        return None
    reach = facts.all_ranks_reach(node, some_path=True)
    if reach.value is not True or rank_tested(facts, node):
        return None
    if facts.sets_up_processes():
        return []
    callers = reach.from_distributed_callers
    if not callers or any(rank_tested(other, site) for other, site in reach.through):
        return None  # no caller sets up processes, or one tests the rank in a way the facts do not parse
    return callers


def launching_process_only(facts: PythonFacts, node: cst.CSTNode, depth: int = 0) -> bool:
    """The script starts its own processes (``mp.spawn(train, ...)``, ``notebook_launcher``, a ``Process``) and
    ``node`` runs in the process that starts them, not in the workers: under ``if __name__ == "__main__":`` at
    module level, or in a function that no such call runs and that every call of this file makes from such a place
    (up to ``MAX_CALLER_DEPTH`` levels)."""
    from lintdist.launch import STARTER_NAMES, starts_processes

    if not starts_processes(facts):
        return False
    function = facts.enclosing_function(node)
    if function is None:
        return any(isinstance(a, cst.If) and _tests_main_module(a.test) for a in facts.ancestors(node))
    name = function.name.value
    handed = any(
        facts.callee_is(call, STARTER_NAMES) and any(n.value == name for n in facts.within(call, cst.Name))
        for call in facts.calls
    )
    sites = facts.call_sites(function)
    if handed or not sites or depth >= MAX_CALLER_DEPTH:
        return False
    return all(launching_process_only(facts, site, depth + 1) for site in sites)


def _tests_main_module(test: cst.BaseExpression) -> bool:
    """``__name__ == "__main__"`` (either way round)."""
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    sides = [test.left, test.comparisons[0].comparator]
    return isinstance(test.comparisons[0].operator, cst.Equal) and {
        "__name__" if isinstance(s, cst.Name) and s.value == "__name__" else getattr(s, "evaluated_value", None)
        for s in sides
    } == {"__name__", "__main__"}
