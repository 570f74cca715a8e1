"""The names a function or lambda reads from outside itself (lintdist/closures.py)."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.closures import free_reads, parameter_names
from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _facts(source: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(source)))
    return PythonFacts(index, NameResolver(index))


def test_a_lambda_reads_its_free_names_in_order():
    facts = _facts(
        """
        import math
        schedule = lambda step: max(0.0, 1 - step / total_steps) * scale + math.cos(step / total_steps)
        """
    )
    (definition,) = facts.index.nodes(cst.Lambda)
    reads = free_reads(facts, definition)
    assert list(reads) == ["total_steps", "scale"]
    assert len(reads["total_steps"]) == 2


def test_a_function_leaves_out_its_own_names():
    facts = _facts(
        """
        from config import warmup

        def schedule(step, *rest, factor=1, **options):
            ratio = step / budget
            for index in range(3):
                ratio += index
            ratio *= factor
            return helper(ratio) * warmup * options["x"] * rest[0] * outside.attribute
        """
    )
    (definition,) = facts.index.nodes(cst.FunctionDef)
    assert list(free_reads(facts, definition)) == ["budget", "outside"]
    assert parameter_names(definition.params) == {"step", "rest", "factor", "options"}
