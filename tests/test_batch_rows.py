"""lintdist/batch_rows.py: what a value computed in a loop over batches holds, row by row."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.batch_rows import batch_derived, first_rows_cut, generated, per_sample_rows, rows_cut
from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


def _gathers(code: str) -> tuple[PythonFacts, cst.For, list[cst.Call]]:
    facts = _facts(code)
    (loop,) = facts.index.nodes(cst.For)
    return facts, loop, [c for c in facts.calls if facts.method_name(c) == "gather"]


LOOP = """
import torch
for batch in loader:
    logits = model(batch["x"])
    loss = criterion(logits, batch["y"])
    preds = logits.argmax(-1)
    tokens = preds.view(-1)
    ids = model.generate(batch["x"])
    gather(preds)
    gather(loss)
    gather(logits.mean())
    gather(tokens)
    gather((preds, batch["y"]))
    gather({"p": preds, "l": loss})
    gather(loss.repeat(8))
    gather(logits[batch["y"] != -100])
    gather(torch.tensor(1.0))
    gather(F.cross_entropy(logits, batch["y"], reduction="none"))
    gather(ids)
    gather(other)
"""


def test_per_sample_rows_of_each_kind_of_value():
    facts, loop, gathers = _gathers(LOOP)
    derived = batch_derived(facts, loop)
    assert {"batch", "logits", "loss", "preds", "tokens", "ids"} <= derived
    assert "other" not in derived
    kinds = [per_sample_rows(facts, g.args[0].value, loop, derived, g) for g in gathers]
    assert kinds == [
        "plain",  # predictions
        None,  # a loss
        None,  # a mean
        "reshaped",  # through a view
        "plain",  # a tuple of per-sample values
        None,  # a dict holding a loss
        None,  # a copied scalar
        "reshaped",  # a boolean mask
        None,  # a scalar tensor
        "plain",  # a per-sample loss
        "plain",  # generated ids
        "plain",  # a name not assigned in the loop: cannot be told otherwise
    ]


def test_generated_values_through_names_and_method_chains():
    facts, loop, gathers = _gathers(LOOP)
    assert [generated(facts, g.args[0].value, loop) for g in gathers].count(True) == 1
    assert generated(facts, gathers[-2].args[0].value, loop)


def test_rows_cut_after_the_call_or_at_it():
    facts = _facts(
        """
        for step, batch in enumerate(loader):
            preds = gather(model(batch))
            if step == last:
                preds = preds[: len(dataset) - seen]
            refs = gather(batch["y"])
            kept = gather(batch["y"])[:n]
            whole = gather(batch["y"])
            whole = whole[1:]
        """
    )
    (loop,) = facts.index.nodes(cst.For)
    gathers = [c for c in facts.calls if facts.method_name(c) == "gather"]
    assert [rows_cut(facts, g, loop.body) for g in gathers] == [True, False, True, False]


def test_first_rows_cut_needs_an_upper_bound_only():
    subscripts = {
        text: cst.parse_expression(text) for text in ("x[:n]", "x[:n, 0]", "x[1:n]", "x[n:]", "x[0]", "x[:, :n]")
    }
    assert [first_rows_cut(s) for s in subscripts.values()] == [True, True, False, False, False, False]


def test_accumulated_in_follows_counts_and_lists_grown_from_the_batch():
    from lintdist.batch_rows import accumulated_in

    facts = _facts(
        """
        def evaluate(loader):
            correct, total, preds, steps = 0, 0, [], 0
            for x, y in loader:
                p = model(x).argmax(1)
                correct += (p == y).sum()
                total += y.numel()
                preds.append(p)
                steps += 1
            stats = torch.tensor([correct, total])
            reduce(stats)
            reduce(preds)
            reduce(steps)
        """
    )
    loop = next(n for n in facts.index.nodes(cst.For))
    calls = [c for c in facts.calls if facts.index.module.code_for_node(c.func) == "reduce"]
    assert [accumulated_in(facts, c.args[0].value, loop, c) for c in calls] == [True, True, False]
