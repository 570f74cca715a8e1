"""Whether a block changes what a name holds (``lintdist.mutation``)."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.mutation import changes, root_name, unpacked
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _changes(body: str, name: str = "batch") -> bool:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(body)))
    facts = PythonFacts(index, NameResolver(index))
    return changes(facts, index.module, name)


def test_reads_do_not_change_a_name():
    assert not _changes("out = model(**batch)\nn = batch['labels'].ne(-100).sum()\nlog(batch)\n")


def test_rebinding_storing_or_deleting():
    assert _changes("batch = to_device(batch)\n")
    assert _changes("batch['labels'][mask] = -100\n")
    assert _changes("del batch['input_ids']\n")
    assert _changes("for batch in more:\n    pass\n")
    assert _changes("a, (b, *batch) = x\n")


def test_in_place_methods_on_it_or_on_what_was_taken_from_it():
    assert _changes("batch.pop('labels')\n")
    assert _changes("labels = batch['labels']\nlabels.masked_fill_(mask, -100)\n")
    assert _changes("labels = batch['labels']\nlabels[0] = -100\n")
    assert not _changes("labels = batch['labels']\nlabels = labels.clone()\n")  # a rebinding of the copy only
    assert not _changes("other.pop('labels')\n")


def test_targets_and_roots():
    (target,) = cst.parse_statement("a, (b, *c) = x\n").body[0].targets
    assert [n.value for n in unpacked(target.target)] == ["a", "b", "c"]
    assert root_name(cst.parse_expression("batch['x'].y(1)[0]")) == "batch"
    assert root_name(cst.parse_expression("(a + b).x")) is None
