"""lintdist/batch_keys.py: ``batch["key"]`` reads and writes, the quote keys are written with, keys named."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.batch_keys import key_quote, keyed, mentions_key
from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


SOURCE = """
def step(batch, other):
    batch['labels'] = batch['input_ids'].clone()
    self.batch["mask"] = 1
    other.update(shift_labels=None)
    return model(**batch)

def check(batch):
    return "shift_labels" in batch
"""


def test_keyed_by_full_name_within_the_scope():
    facts = _facts(SOURCE)
    step, check = facts.functions["step"][0], facts.functions["check"][0]
    assert keyed(facts, step, cst.Name("batch"), "labels")
    assert not keyed(facts, step, cst.Name("batch"), "mask")
    assert keyed(facts, step, cst.parse_expression("self.batch"), "mask")
    assert not keyed(facts, check, cst.Name("batch"), "labels")
    assert not keyed(facts, step, cst.parse_expression("f()"), "labels")


def test_the_quote_of_the_first_key_else_double():
    facts = _facts(SOURCE)
    assert key_quote(facts, cst.Name("batch")) == "'"
    assert key_quote(facts, cst.parse_expression("self.batch")) == '"'
    assert key_quote(facts, cst.Name("nothing")) == '"'


def test_a_key_named_as_string_or_keyword():
    facts = _facts(SOURCE)
    step, check = facts.functions["step"][0], facts.functions["check"][0]
    assert mentions_key(facts, step, "shift_labels")
    assert mentions_key(facts, check, "shift_labels")
    assert not mentions_key(facts, check, "labels")
    assert mentions_key(facts, facts.index.module, "input_ids")
