"""``lintdist.model_use``: whether calls run a model's forward or hand the model on."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.model_use import runs_or_passes
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _runs(code: str) -> bool:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    facts = PythonFacts(index, NameResolver(index))
    block = facts.index.nodes(cst.With)[-1]
    model = block.items[0].item.func.value
    return runs_or_passes(facts, facts.calls_within(block.body), model, block)


def test_a_call_of_the_model_or_its_forward_runs_it():
    assert _runs("model = DDP(net)\nwith model.no_sync():\n    out = model(x)\n")
    assert _runs("model = DDP(net)\nwith model.no_sync():\n    out = model.forward(x)\n")
    assert _runs("model = DDP(net)\nalias = model\nwith model.no_sync():\n    out = alias(x)\n")


def test_passing_the_model_counts_and_other_methods_do_not():
    assert _runs("model = DDP(net)\nwith model.no_sync():\n    loss = compute(model, x)\n")
    assert not _runs("model = DDP(net)\nwith model.no_sync():\n    model.zero_grad()\n    loss.backward()\n")
