"""lintdist/model_outputs.py: whether a script reads a model call's own loss or only its other fields."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.loop import TrainingLoop
from lintdist.model_outputs import loss_read_in, reads_loss_field, reads_model_loss
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


def _read(facts: PythonFacts, function: str) -> bool:
    call = next(c for c in facts.calls_within(facts.functions[function][0]) if facts.method_name(c) == "model")
    return reads_model_loss(facts, call)


def test_the_loss_read_inline_or_through_the_output_name():
    facts = _facts(
        """
        def inline(batch):
            return model(**batch).loss
        def logits_only(batch):
            out = model(**batch)
            out = other
            return out.logits, out["hidden_states"], out[1]
        def first_element(batch):
            out = model(**batch)
            return out.logits, out[0]
        def handed_on(batch):
            out = model(**batch)
            return out
        def not_assigned(batch):
            return model(**batch)
        def logits_inline(batch):
            return model(**batch)["logits"]
        """
    )
    assert _read(facts, "inline")
    assert not _read(facts, "logits_only")
    assert _read(facts, "first_element")
    assert _read(facts, "handed_on")
    assert _read(facts, "not_assigned")
    assert not _read(facts, "logits_inline")


def test_which_fields_may_be_the_loss():
    assert reads_loss_field(cst.parse_expression("out.loss"))
    assert not reads_loss_field(cst.parse_expression("out.router_logits"))
    assert reads_loss_field(cst.parse_expression("out[key]"))
    assert reads_loss_field(cst.parse_expression("out[0]"))
    assert not reads_loss_field(cst.parse_expression("out[2]"))
    assert reads_loss_field(cst.parse_expression("out[1:]"))


def test_the_loss_read_inline_or_through_the_last_binding():
    facts = _facts(
        """
        def train(batch):
            out = model(**batch)
            out.loss.backward()
            logits = model(**batch).logits
            inline = model(**batch)["loss"]
        """
    )
    loop = TrainingLoop(facts, None)
    scope = facts.functions["train"][0]
    bound, logits, inline = [c for c in facts.calls if facts.method_name(c) == "model"]
    assert loss_read_in(facts, loop, bound, scope)
    assert not loss_read_in(facts, loop, logits, scope)
    assert loss_read_in(facts, loop, inline, scope)
