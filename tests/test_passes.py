"""Backward passes and forward calls along the paths of a block (lintdist/passes.py)."""

from __future__ import annotations

import textwrap
from types import SimpleNamespace

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.loop import TrainingLoop
from lintdist.names import NameResolver
from lintdist.passes import PassCounter, Paths, Tally, models_per_backward
from lintdist.positions import Positions
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


def test_models_per_backward_in_evaluation_order():
    text = textwrap.dedent(
        """
        def step(generator, batch):
            accelerator.backward(generator(batch).loss)

        with accelerator.accumulate(gen, disc):
            step(gen, batch)
            with torch.no_grad():
                disc(batch)
            accelerator.backward(disc(fake.detach()).loss)
            gen(batch)
        """
    )
    index = SyntaxIndex(cst.parse_module(text))
    loop = TrainingLoop(PythonFacts(index, NameResolver(index)))
    block = index.nodes(cst.With)[0]
    positions = Positions(index.module, text, index.parent)

    def span(node):
        _, _, end_line, end_column = positions.range(node)
        return SimpleNamespace(end_line=end_line, end_column=end_column)

    counter = PassCounter(loop, frozenset({"gen", "disc"}))
    # the helper's backward ends the first run (gen, handed to it); the unclosed call of gen after the last backward
    # runs for no backward; the disc call under no_grad does not run
    assert models_per_backward(counter, block, span) == [{"gen"}, {"disc"}]
