"""How a loss is normalised (``lintdist.normalisation``), on small training loops."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.loop import TrainingLoop
from lintdist.names import NameResolver
from lintdist.normalisation import (
    counted_labels,
    gradient_scaling,
    normalisation,
    on_one_path,
    predicted_positions,
)
from lintdist.syntax import SyntaxIndex


def _loop(source: str) -> TrainingLoop:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(source)))
    return TrainingLoop(PythonFacts(index, NameResolver(index)), None)


def _norms(loop: TrainingLoop):
    return [normalisation(loop, loop.chain(s.loss, loop.statement_of(s.call))) for s in loop.backward_sites]


def _code(loop: TrainingLoop, node: cst.CSTNode) -> str:
    return loop.facts.index.module.code_for_node(node)


SOURCE = """
import torch.distributed as dist
for batch in loader:
    out = model(**batch)
    num_tokens = (batch["labels"] != -100).sum()
    out.loss.backward()
    (out.loss * num_tokens).backward()
    global_tokens = num_tokens.clone()
    dist.all_reduce(global_tokens)
    (out.loss * num_tokens * dist.get_world_size() / global_tokens).backward()
    (out.loss * 4 / grad_accum_steps).backward()
"""


def test_a_mean_a_folded_sum_and_a_normalised_sum():
    loop = _loop(SOURCE)
    mean, folded, normalised, scaled = _norms(loop)
    assert (mean.base, mean.count, mean.counted) == ("mean", None, False)
    assert (folded.base, folded.count, folded.counted) == ("sum", None, True)  # mean x this rank's count
    assert normalised.base == "sum" and _code(loop, normalised.count.expr) == "global_tokens"
    assert normalised.world and normalised.accumulation == 0
    assert (scaled.base, scaled.literal, scaled.accumulation, scaled.divided_by_accumulation) == ("mean", 4, 0, True)


def test_a_gathered_count_above_is_not_folded():
    loop = _loop(
        """
        num_tokens_all = accelerator.gather(num_tokens).sum()
        for batch in loader:
            accelerator.backward(model(**batch).loss * num_tokens_all)
        """
    )
    (norm,) = _norms(loop)
    assert norm.base == "mean" and norm.counted


def test_counted_labels_and_the_causal_shift():
    loop = _loop(SOURCE)
    site = loop.backward_sites[2]
    count = normalisation(loop, loop.chain(site.loss, loop.statement_of(site.call))).count
    labels = counted_labels(loop, count)
    assert _code(loop, labels) == 'batch["labels"]'
    assert _code(loop, predicted_positions(labels)) == 'batch["labels"][..., 1:]'
    other = _loop("n = (mask != 0).sum()\nfor b in loader:\n    (model(b).loss.sum() / n).backward()\n")
    site = other.backward_sites[0]
    count = normalisation(other, other.chain(site.loss, other.statement_of(site.call))).count
    assert count is not None and counted_labels(other, count) is None


def test_gradient_scaling_after_backward_and_on_one_path():
    loop = _loop(
        """
        def step(batch, num_tokens):
            if optimizer_in_backward:
                loss = model(batch).loss.sum() / num_tokens
            else:
                loss = model(batch).loss.sum()
            loss.backward()
            scale_grads(model, 1 / num_tokens)
        """
    )
    site = loop.backward_sites[0]
    numerator, count = gradient_scaling(loop, site.call)
    assert (_code(loop, numerator.expr), _code(loop, count.expr)) == ("1", "num_tokens")
    division = next(iter(loop.facts.index.nodes(cst.BinaryOperation)))
    term = type(count)(division.right, loop.facts.parent(loop.facts.parent(division)))
    assert on_one_path(loop.facts, term, site.call)
    plain = _loop("loss.backward()\nclip(model, 1.0)\n")
    assert gradient_scaling(plain, plain.backward_sites[0].call) is None
