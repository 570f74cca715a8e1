"""Where a call's value goes (lintdist.value_uses)."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex
from lintdist.value_uses import assigned_reads, discarded


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


CODE = """
    def resume():
        convert(1)
        unused = convert(2)
        _ = convert(3)
        used = convert(4)
        optim.load_state_dict(used)
        a, b = convert(5)
        return convert(6)
"""


def test_discarded_is_a_bare_call_or_a_name_never_read() -> None:
    facts = _facts(CODE)
    converts = [c for c in facts.calls if facts.method_name(c) == "convert"]
    assert [discarded(facts, c) is not None for c in converts] == [True, True, True, False, False, False]


def test_assigned_reads_lists_the_reads_of_the_one_name() -> None:
    facts = _facts(CODE)
    converts = [c for c in facts.calls if facts.method_name(c) == "convert"]
    reads = [assigned_reads(facts, c) for c in converts]
    assert reads[0] is None and reads[4] is None and reads[5] is None
    assert reads[1] == [] and reads[2] == []
    assert [facts.parent(facts.parent(r)) for r in reads[3]] == [facts.calls[-3]]
