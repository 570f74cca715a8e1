"""lintdist/exits.py: the loop a ``break`` or ``return`` leaves."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.exits import left_loop
from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


def test_break_leaves_its_own_loop_and_return_the_outermost():
    facts = _facts(
        """
        def train():
            for epoch in range(3):
                for batch in loader:
                    if done:
                        break
                    if stop:
                        return
            else:
                break
        break
        """
    )
    outer, inner = facts.index.nodes(cst.For)
    first, in_else, outside = facts.index.nodes(cst.Break)
    (exit_,) = facts.index.nodes(cst.Return)
    assert left_loop(facts, first) is inner
    assert left_loop(facts, exit_) is outer
    assert left_loop(facts, in_else) is outer  # a loop's `else:` is around the break, not its body
    assert left_loop(facts, outside) is None
