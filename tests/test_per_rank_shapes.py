"""The program model's "does this tensor have a shape of its own on each rank?" question (lintdist.per_rank_shapes)."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.per_rank_shapes import generated_sequences, is_generate, per_rank_source
from lintdist.syntax import SyntaxIndex


def _gathered(code: str) -> tuple[PythonFacts, cst.Call]:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    facts = PythonFacts(index, NameResolver(index))
    call = next(c for c in facts.calls if facts.method_name(c) == "gather")
    return facts, call


@pytest.mark.parametrize(
    ("code", "found"),
    [
        ("out = model.generate(ids)\naccelerator.gather(out)", True),
        ("out = model.generate(ids)\nnew = out[:, ids.shape[1]:].cpu()\naccelerator.gather(new)", True),
        ("out = model.generate(ids, return_dict_in_generate=True)\naccelerator.gather(out.sequences)", True),
        ("out = model.generate(ids)\nout = out[:, 4:].contiguous()\naccelerator.gather(out)", True),
        (
            "out = model.generate(ids)\nout = accelerator.pad_across_processes(out, dim=1)\naccelerator.gather(out)",
            False,
        ),
        ("out = model.generate(ids) if sample else labels\naccelerator.gather(out)", False),
        ("def f(out):\n    return accelerator.gather(out)", False),
        ("out, _ = pair\naccelerator.gather(out)", False),
        ("accelerator.gather(batch['labels'])", False),
    ],
)
def test_generated_sequences(code: str, found: bool) -> None:
    facts, call = _gathered(code)
    assert (generated_sequences(facts, call.args[0].value, call) is not None) is found


@pytest.mark.parametrize(
    ("code", "source"),
    [
        ("kept = losses[mask.bool()].float()\naccelerator.gather(kept)", "losses[mask.bool()]"),
        ("accelerator.gather(torch.masked_select(scores, keep))", "torch.masked_select(scores, keep)"),
        ("kept = scores.masked_select(keep).detach()\naccelerator.gather(kept)", "scores.masked_select(keep)"),
        ("out = model.generate(ids)\naccelerator.gather(out[:, 3:])", "model.generate(ids)"),
        (
            "kept = losses[mask.bool()]\nkept = accelerator.pad_across_processes(kept, dim=0)\naccelerator.gather(kept)",
            None,
        ),
        ("accelerator.gather(losses[mask.bool()].sum())", None),  # reduced to one value per rank
        ("accelerator.gather(losses[mask])", None),  # an integer index tensor keeps its own length
        ("accelerator.gather(losses[:, mask.bool()])", None),  # several indices: not followed
        ("accelerator.gather(torch.cat([kept, padding]))", None),
    ],
)
def test_per_rank_source(code: str, source: str | None) -> None:
    facts, call = _gathered(code)
    found = per_rank_source(facts, call.args[0].value, call)
    assert (None if found is None else cst.Module([]).code_for_node(found)) == source
    assert is_generate(facts, found) is (source is not None and ".generate(" in source)
