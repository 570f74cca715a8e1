"""Whether code runs on every rank at once, or is ordered: one rank first, or some ranks only.

Code is ordered inside a main-process-first block (``accelerator.main_process_first()``,
``training_args.main_process_first(desc=...)``, ``torch_distributed_zero_first(rank)``, a context manager of the file
that waits at a barrier), on one side of a rank test, in a loop over this rank's own items, after the rank-0-first
``if rank != 0: dist.barrier()``, or in a function called only from such places (in this module, and under a rank test
in the project's other modules).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.datasets import names_rank
from lintdist.facts import MAX_CALLER_DEPTH

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts

BARRIER_METHODS = frozenset({"barrier", "wait_for_everyone"})


def goes_first(facts: PythonFacts, context: cst.BaseExpression) -> bool:
    """Whether a ``with`` item lets one process go first: a ``*first*`` context manager (``main_process_first()``,
    ``torch_distributed_zero_first(rank)``, a name bound to one), or a context manager of this file that waits at a
    barrier (``rank0_then_others(rank)``)."""
    target = context.func if isinstance(context, cst.Call) else context
    candidates = [target] + [o.node for o in facts.origins(target) if isinstance(o.node, cst.BaseExpression)]
    for candidate in candidates:
        if isinstance(candidate, cst.IfExp):
            candidates.extend((candidate.body, candidate.orelse))
        elif "first" in (get_full_name_for_node(candidate) or "").rsplit(".", 1)[-1]:
            return True
    return isinstance(context, cst.Call) and any(
        facts.method_name(call) in BARRIER_METHODS
        for function in facts.local_functions(context)
        for call in facts.reachable_calls(function)
    )


def after_rank_barrier(facts: PythonFacts, block: cst.IndentedBlock | cst.Module, child: cst.CSTNode) -> bool:
    """Whether an earlier statement of ``block`` than ``child`` opens the rank-0-first idiom: ``if rank != 0:`` with a
    barrier in its body."""
    for statement in block.body:
        if statement is child:
            return False
        if (
            isinstance(statement, cst.If)
            and facts.excludes_main(statement.test, True)
            and any(facts.method_name(call) in BARRIER_METHODS for call in facts.calls_within(statement.body))
        ):
            return True
    return False


def runs_ordered(facts: PythonFacts, node: cst.CSTNode, depth: int = 0) -> bool:
    """Whether ``node`` never runs on every rank at once: in a main-process-first block, on one side of a rank test,
    in a loop over per-rank items, after the rank-0-first barrier, or in a function whose every caller is ordered."""
    child = node
    for ancestor in facts.ancestors(node):
        if isinstance(ancestor, cst.With) and any(goes_first(facts, item.item) for item in ancestor.items):
            return True
        if isinstance(ancestor, cst.If) and child is not ancestor.test and facts.rank_dependent(ancestor.test):
            return True
        # `for url in urls[rank::world_size]:` each rank has its own items, and its own number of iterations
        if isinstance(ancestor, cst.For) and child is ancestor.body and names_rank(facts, ancestor.iter):
            return True
        if isinstance(ancestor, (cst.IndentedBlock, cst.Module)) and after_rank_barrier(facts, ancestor, child):
            return True
        if isinstance(ancestor, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            break
        child = ancestor
    if facts.rank_guard(node) is not None:
        return True
    function = facts.enclosing_function(node)
    if function is None or depth >= MAX_CALLER_DEPTH:
        return False
    sites = facts.call_sites(function)
    # callers in the project's other modules: one under a rank test there (open_clip builds its audio zero-shot set
    # under `if is_master(args):` in main.py) is ordered already
    elsewhere = facts.external_call_sites(function)
    if not sites and not elsewhere:
        return False
    return all(runs_ordered(facts, site, depth + 1) for site in sites) and all(
        site.facts.all_ranks_reach(site.call).value is False for site in elsewhere
    )
