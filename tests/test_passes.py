"""Backward passes and forward calls along the paths of a block (lintdist/passes.py)."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.loop import TrainingLoop
from lintdist.names import NameResolver
from lintdist.passes import PassCounter, Paths, Tally
from lintdist.syntax import SyntaxIndex


def _count(source: str, models=frozenset({"model"})):
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(source)))
    loop = TrainingLoop(PythonFacts(index, NameResolver(index)))
    block = next(w for w in index.nodes(cst.With) if "accumulate" in index.module.code_for_node(w.items[0]))
    counter = PassCounter(loop, models)
    return counter.suite(block.body), counter


def test_sequential_backward_passes_add_up_and_branches_are_alternatives():
    paths, counter = _count(
        """
        with accelerator.accumulate(model):
            out = model(x)
            accelerator.backward(out.loss, retain_graph=True)
            if aux:
                accelerator.backward(out.aux)
            else:
                accelerator.backward(out.other)
        """
    )
    assert paths.most == Tally(backward=2, forward=1)
    assert len(counter.walk.backward_calls) == 3
    assert counter.walk.loop is None


def test_a_loop_records_itself_and_counts_its_body_once():
    paths, counter = _count(
        """
        with accelerator.accumulate(model):
            for chunk in batch:
                model(chunk).backward()
        """
    )
    assert paths.most == Tally(backward=1, forward=1)
    assert isinstance(counter.walk.loop, cst.For)


def test_early_exits_no_grad_and_helpers():
    paths, counter = _count(
        """
        def helper(batch):
            model(batch).backward()
            model(batch).backward()

        with accelerator.accumulate(model):
            with torch.no_grad():
                model(x).backward()
            if skip:
                return
            helper(x)
            model.requires_grad_(False)
        """
    )
    assert paths.through == Tally(backward=2)  # the helper's forwards are not counted, its backwards are
    assert paths.left == Tally()
    assert len(counter.walk.frozen) == 1


def test_paths_combine():
    one, two = Tally(1, 0), Tally(0, 2)
    assert Paths(one).then(Paths(two)).through == Tally(1, 2)
    assert Paths(None, one).then(Paths(two)) == Paths(None, one)  # left early: nothing after counts
    assert Paths(one).either(Paths(two)).most == Tally(1, 2)
