"""What bounds a loop: which names its ``range``, its ``while`` test or an ``if ...: break`` compares against.

A step budget (``args.max_train_steps``) is recognised by what it does: the training loop stops on it. These
questions find the loops around given calls (also around the calls of the function holding them) and the test
that compares a name, or a name assigned from it (``b = a``), with the steps taken.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
from libcst.helpers import get_full_name_for_node

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts

Loop = cst.For | cst.While


def loop_bounds(facts: PythonFacts, loop: Loop) -> list[tuple[set[str], cst.CSTNode]]:
    """What can bound ``loop``, in order, each with the full names it mentions: a ``range(...)`` in a ``for``'s
    iterable (``range(n)``, ``tqdm(range(n))``), a ``while`` test's comparisons, and the comparisons of each ``if
    ...: break``/``return`` in the body; the node is the loop, or the ``if``."""
    memo = facts._memo.setdefault("loop_bounds", {})
    if id(loop) in memo:
        return memo[id(loop)]
    found: list[tuple[set[str], cst.CSTNode]] = []
    if isinstance(loop, cst.For):
        ranges = [c for c in facts.within(loop.iter, cst.Call) if get_full_name_for_node(c.func) == "range"]
        found += [(full_names(facts, call), loop) for call in ranges]
    else:
        found += [(full_names(facts, c), loop) for c in facts.within(loop.test, cst.Comparison)]
    for test in facts.within(loop.body, cst.If):
        if facts.within(test.body, cst.Break, cst.Return):
            found += [(full_names(facts, c), test) for c in facts.within(test.test, cst.Comparison)]
    memo[id(loop)] = found
    return found


def loops_around(facts: PythonFacts, calls: list[cst.Call], rounds: int = 3) -> list[Loop]:
    """The loops around ``calls``, innermost first, and around the call sites of the functions holding them (up to
    ``rounds`` functions out)."""
    loops: list[Loop] = []
    pending = list(calls)
    seen: set[int] = set()
    for _ in range(rounds):
        following = []
        for node in pending:
            for ancestor in facts.ancestors(node):
                if isinstance(ancestor, (cst.For, cst.While)) and id(ancestor) not in seen:
                    seen.add(id(ancestor))
                    loops.append(ancestor)
                if isinstance(ancestor, cst.FunctionDef):
                    following.extend(facts.call_sites(ancestor))
                    break
        pending = following
    return loops


def bounding_test(facts: PythonFacts, key: str, loops: list[Loop]) -> cst.CSTNode | None:
    """The first bound of ``loops`` (see ``loop_bounds``) that mentions ``key`` or a name assigned from it."""
    aliases = {key} | assigned_from(facts).get(key, set())
    for loop in loops:
        for names, bound in loop_bounds(facts, loop):
            if names & aliases:
                return bound
    return None


def assigned_from(facts: PythonFacts) -> dict[str, set[str]]:
    """For each full name, the full names assigned from it as they are (``b = a``: ``{"a": {"b"}}``)."""
    if "assigned_from" not in facts._memo:
        found: dict[str, set[str]] = {}
        for assign in facts.index.nodes(cst.Assign):
            source = get_full_name_for_node(assign.value)
            if source is not None:
                targets = {get_full_name_for_node(t.target) for t in assign.targets} - {None}
                found.setdefault(source, set()).update(targets)
        facts._memo["assigned_from"] = found
    return facts._memo["assigned_from"]


def full_names(facts: PythonFacts, expr: cst.CSTNode) -> set[str]:
    """The full names of the names and attributes in ``expr`` (``args.max_train_steps``, ``step``)."""
    return {name for node in facts.within(expr, cst.Name, cst.Attribute) if (name := get_full_name_for_node(node))}
