"""Whether a loop evaluates (lintdist/evaluation.py)."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.evaluation import evaluates
from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _facts(source: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(source)))
    return PythonFacts(index, NameResolver(index))


def test_evaluation_passes_and_training_passes():
    facts = _facts(
        """
        import torch
        def validate(loader):
            for batch in loader:
                metric(model(batch))
        def mine(loader):
            for batch in loader:
                stats(model(batch))
        def train(loader):
            model.eval()
            for batch in loader:
                model(batch).sum().backward()
        def score(loader):
            model.eval()
            for batch in loader:
                metric(model(batch))
        with torch.no_grad():
            for batch in loader:
                model(batch).sum().backward()
        """
    )
    assert [evaluates(facts, loop) for loop in facts.loops] == [True, False, False, True, True]
