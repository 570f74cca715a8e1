"""Which ranks run a statement: the main process only, every rank but the main one, or every rank under one backend.

``PythonFacts.rank_guard`` answers inside one function; the questions here follow a function's callers
(``main_only``), find the branch that leaves the main process out (``others_branch``), the ``if is_main or
DeepSpeed`` form (``main_or_deepspeed_guard``) and the main-process guards nested around a guard
(``outermost_main_guard``). The answers come from the facts' indexes (no walk of their own).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import (
    MAIN_FLAG_WORDS,
    MAIN_FLAGS,
    MAIN_ONLY_DECORATORS,
    MAX_CALLER_DEPTH,
    RANK_GETTERS,
    RANK_NAMES,
)
from lintdist.rule import Pattern, words

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts

_SCOPES = (cst.FunctionDef, cst.Lambda, cst.ClassDef)


def main_only(facts: PythonFacts, node: cst.CSTNode, depth: int = 0) -> tuple[cst.CSTNode, cst.Call | None] | None:
    """The guard that keeps ``node`` on the main process (``facts.rank_guard`` in its function, or at a call site
    of it, followed up to ``MAX_CALLER_DEPTH``), with the call of this function it passes through (None when the
    guard is in ``node``'s own function); None when no caller's guard is found."""
    if never_with_main(facts, node):
        return None
    guard = facts.rank_guard(node)
    if guard is not None:
        return guard, None
    function = facts.enclosing_function(node)
    if function is None or depth >= MAX_CALLER_DEPTH:
        return None
    for site in facts.call_sites(function):
        found = main_only(facts, site, depth + 1)
        if found is not None:
            return found[0], found[1] or site
    return None


def others_branch(facts: PythonFacts, node: cst.CSTNode) -> cst.If | None:
    """The ``if`` whose branch around ``node`` (in its function) only the ranks other than the main one take (the
    ``else:`` of ``if accelerator.is_main_process:``, ``if rank != 0:``)."""
    child = node
    for ancestor in facts.ancestors(node):
        if isinstance(ancestor, _SCOPES):
            return None
        if isinstance(ancestor, cst.If) and (
            (child is ancestor.body and facts.excludes_main(ancestor.test, True))
            or (child is ancestor.orelse and facts.excludes_main(ancestor.test, False))
        ):
            return ancestor
        child = ancestor
    return None


def never_with_main(facts: PythonFacts, node: cst.CSTNode) -> bool:
    """``node`` sits, within its function, in a branch that excludes the main process (``if rank != 0:``) or runs
    only in a one-process job (``if local_rank == -1:``, ``facts.single_process_when``), so a main-only caller never
    reaches it there."""
    child = node
    for ancestor in facts.ancestors(node):
        if isinstance(ancestor, _SCOPES):
            return False
        if isinstance(ancestor, cst.If):
            if child is ancestor.body and (
                facts.excludes_main(ancestor.test, True) or facts.single_process_when(ancestor.test, True)
            ):
                return True
            if child is ancestor.orelse and facts.excludes_main(ancestor.test, False):
                return True
        child = ancestor
    return False


def main_or_deepspeed_guard(facts: PythonFacts, node: cst.CSTNode) -> cst.If | None:
    """``if accelerator.distributed_type == DistributedType.DEEPSPEED or accelerator.is_main_process:`` (either
    order) around ``node`` in its function: every rank enters it under DeepSpeed, only the main process under any
    other backend."""
    child = node
    for ancestor in facts.ancestors(node):
        if isinstance(ancestor, _SCOPES):
            return None
        if isinstance(ancestor, cst.If) and child is ancestor.body:
            operands = or_operands(ancestor.test)
            mains = [o for o in operands if facts.main_when(o, True)]
            if len(operands) > 1 and mains and all(o in mains or _is_deepspeed_test(o) for o in operands):
                return ancestor
        child = ancestor
    return None


def under_main_guard(facts: PythonFacts, node: cst.CSTNode) -> bool:
    """An ``if`` around ``node`` in its function has a branch only the main process enters (an ``or`` of which one
    operand is a main-process test counts: the DeepSpeed-or-main form)."""
    child: cst.CSTNode = node
    for ancestor in facts.ancestors(node):
        if isinstance(ancestor, _SCOPES):
            return False
        if (
            isinstance(ancestor, cst.If)
            and child is ancestor.body
            and any(facts.main_when(o, True) for o in [*or_operands(ancestor.test), ancestor.test])
        ):
            return True
        child = ancestor
    return False


def outermost_main_guard(facts: PythonFacts, guard: cst.If) -> tuple[cst.If, list[cst.If]]:
    """The outermost main-only ``if`` around ``guard`` in its function (``if sync and accelerator.is_main_process:``
    around ``if step % k == 0:`` around ``if accelerator.is_main_process:``), and the main-only ``if``s inside it
    down to ``guard``, innermost first."""
    chain = [guard]
    child: cst.CSTNode = guard
    for ancestor in facts.ancestors(guard):
        if isinstance(ancestor, _SCOPES):
            break
        if (
            isinstance(ancestor, cst.If)
            and child is ancestor.body
            and (facts.main_when(ancestor.test, True) or main_conjuncts(facts, ancestor.test)[0])
        ):
            chain.append(ancestor)
        child = ancestor
    return chain[-1], chain[:-1]


def main_conjuncts(facts: PythonFacts, test: cst.BaseExpression) -> tuple[list, list]:
    """The conjuncts of an ``and`` test that imply the main process, and the others (none split off for a test
    that is not an ``and``)."""
    if not (isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And)):
        return [], []
    parts: list[cst.BaseExpression] = []
    pending = [test]
    while pending:
        node = pending.pop()
        if isinstance(node, cst.BooleanOperation) and isinstance(node.operator, cst.And) and not node.lpar:
            pending.extend((node.right, node.left))
        else:
            parts.append(node)
    mains = [p for p in parts if facts.main_when(p, True)]
    return mains, [p for p in parts if all(p is not m for m in mains)]


def or_operands(test: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The operands of ``a or b or c`` (``[test]`` for any other test)."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.Or):
        return [*or_operands(test.left), *or_operands(test.right)]
    return [test]


def outermost_function(facts: PythonFacts, node: cst.CSTNode) -> cst.FunctionDef | None:
    """The top-level function ``node`` is in (through nested functions), None at module level."""
    function = facts.enclosing_function(node)
    while function is not None and (outer := facts.enclosing_function(function)) is not None:
        function = outer
    return function


def _is_deepspeed_test(test: cst.BaseExpression) -> bool:
    """``<x>.distributed_type == DistributedType.DEEPSPEED`` (or ``is``)."""
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    target = test.comparisons[0]
    if not isinstance(target.operator, (cst.Equal, cst.Is)):
        return False
    left = (get_full_name_for_node(test.left) or "").rsplit(".", 1)[-1]
    right = (get_full_name_for_node(target.comparator) or "").rsplit(".", 1)[-1]
    return {left, right} == {"distributed_type", "DEEPSPEED"}



# A rule's trigger group (``Rule.also_triggers``) for a file that may hold a main-process guard the facts recognise.
MAIN_GUARD_TEXTS = (
    # a rank, a main-process flag or decorator
    words(*(RANK_NAMES - {"rank"}), *RANK_GETTERS, *MAIN_FLAGS, *MAIN_ONLY_DECORATORS, "RANK", "LOCAL_RANK"),
    # a bare `rank` only where something tests it (`rank == 0`, `rank % n == 0`, `if not rank:`): the word alone is
    # in every low-rank adapter and tensor-parallel module of a library tree
    Pattern(("rank",), re.compile(r"(?m)rank\w*\s*(?:[=!<>]=|[<>%]|in\b|not\s+in\b|:\s*$|and\b|or\b)")),
    # a project's own flag (`self.is_main`, `env.is_global_main()`), which the facts read by its name
    *MAIN_FLAG_WORDS,
)
