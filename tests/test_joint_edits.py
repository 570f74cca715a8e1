"""Several edits as one replacement (lintdist/joint_edits.py)."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.joint_edits import block_statement, common_ancestor, joint_replacement
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex

SOURCE = """
x = 1
for epoch in range(3):
    if resume:
        loader = skip(loader)
    for batch in loader:
        step(batch)
"""


def _facts(source: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(source)))
    return PythonFacts(index, NameResolver(index))


def test_block_statement_is_the_child_of_the_block():
    facts = _facts(SOURCE)
    loop = facts.loops[0]
    skip = next(c for c in facts.calls if c.func.value == "skip")
    assert isinstance(block_statement(facts, skip, loop.body), cst.If)
    assert block_statement(facts, skip, facts.index.module) is loop
    assert block_statement(facts, loop, loop.body) is None


def test_common_ancestor():
    facts = _facts(SOURCE)
    skip = next(c for c in facts.calls if c.func.value == "skip")
    step = next(c for c in facts.calls if c.func.value == "step")
    assert common_ancestor(facts, [skip, step]) is facts.loops[0].body
    assert common_ancestor(facts, [skip, skip]) is skip


def test_joint_replacement_replaces_and_inserts_in_one_node():
    facts = _facts(SOURCE)
    loop = facts.loops[0]
    gate, inner = loop.body.body
    there = inner.iter
    old, new = joint_replacement(
        facts,
        [gate, there],
        {id(there): cst.Name("active")},
        {id(gate): [cst.parse_statement("active = loader\n")]},
        {},
    )
    assert old is loop.body
    text = cst.Module([]).code_for_node(loop.with_changes(body=new))
    assert "    active = loader\n    if resume:" in text
    assert "for batch in active:" in text
    assert "x = 1" not in text
