"""``lintdist.branches``: a branch whose test the file's constants make false never runs."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.branches import conditional_within, never_runs
from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _dead(code: str) -> list[bool]:
    """For each call of ``wrap(...)``, in source order: whether it never runs."""
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    facts = PythonFacts(index, NameResolver(index))
    calls = [c for c in facts.calls if isinstance(c.func, cst.Name) and c.func.value == "wrap"]
    return [never_runs(facts, call) is not None for call in calls]


def test_a_module_constant_makes_a_comparison_false_inside_a_function():
    assert _dead(
        """
        num_gpus = 1

        def main(device):
            if device.type == "cuda" and num_gpus > 1:
                wrap(1)
            else:
                wrap(2)
            if num_gpus > 0:
                wrap(3)
        """
    ) == [True, False, False]


def test_a_name_that_changes_or_comes_from_outside_is_no_constant():
    assert _dead(
        """
        num_gpus = 1
        count = 1
        count += 1

        def main(world):
            if num_gpus > 1 or world > 1:
                wrap(1)
            if count > 1:
                wrap(2)
            if world > 1:
                wrap(3)

        def configure():
            global num_gpus
            num_gpus = 4
        """
    ) == [False, False, False]


def test_a_name_bound_to_two_values_is_no_constant():
    assert _dead(
        """
        import sys
        n = 1
        if len(sys.argv) > 1:
            n = 2
        if n > 1:
            wrap(1)
        if False:
            wrap(2)
        """
    ) == [False, True]


def test_conditional_within_a_function_only():
    index = SyntaxIndex(
        cst.parse_module(
            textwrap.dedent(
                """
                if flag:
                    def step():
                        wrap(0)
                        for x in y:
                            wrap(1)
                        value = wrap(2) if ok else None
                        try:
                            wrap(3)
                        except E:
                            pass
                        while go:
                            wrap(4)
                """
            )
        )
    )
    facts = PythonFacts(index, NameResolver(index))
    step = facts.functions["step"][0]
    assert [conditional_within(facts, c, step) for c in facts.calls] == [False, False, True, True, True]
