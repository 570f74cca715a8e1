"""lintdist/blocks.py: simple statements, runs of them, ``with`` blocks around a run, constructors that run code."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.blocks import (
    constructions_running,
    literal_binding,
    simple_statement,
    statement_before,
    statement_run,
    with_block,
)
from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


def _call(facts: PythonFacts, text: str) -> cst.Call:
    module = facts.index.module
    return next(c for c in facts.calls if module.code_for_node(c.func) == text)


def test_simple_statement_only_in_a_block():
    facts = _facts("x = f()\nif g():\n    y = h()\nif k(): z = 1\n")
    assert simple_statement(facts, _call(facts, "f")) is facts.index.module.body[0]
    assert simple_statement(facts, _call(facts, "h")) is not None
    assert simple_statement(facts, _call(facts, "g")) is None  # a header
    assert simple_statement(facts, _call(facts, "k")) is None


def test_a_run_spans_the_marked_statements_and_stops_at_a_refused_one():
    facts = _facts("a = f()\nb = 1\nc = g()\nstop()\nd = h()\n")
    body = facts.index.module.body
    marked = {id(body[0]), id(body[2]), id(body[4])}

    def joinable(statement: cst.SimpleStatementLine) -> bool:
        return "stop" not in facts.index.module.code_for_node(statement)

    assert statement_run(facts, body[2], marked, joinable) == list(body[0:3])
    assert statement_run(facts, body[4], marked, joinable) == [body[4]]
    assert statement_run(facts, body[3], marked, joinable) is None


def test_with_block_wraps_a_run_and_keeps_its_leading_comment():
    module = cst.parse_module("# why\na = f()\nb = g()\nc = 3\n")
    run = list(module.body[:2])
    replacements = {id(old): new for old, new in with_block(run, "ctx()")}

    class Apply(cst.CSTTransformer):
        def on_leave(self, original, updated):
            return replacements.get(id(original), updated)

    assert module.visit(Apply()).code == "# why\nwith ctx():\n    a = f()\n    b = g()\nc = 3\n"


def test_constructions_running_a_constructor_helper():
    facts = _facts(
        """
        class Captions:
            def __init__(self, name):
                self.rows = self._rows(name)

            def _rows(self, name):
                return download(name)

            def other(self):
                return fetch()

        class Shared:
            def __init__(self):
                self.helper()

            def helper(self):
                prepare()

            def again(self):
                self.helper()

        captions = Captions("x")
        shared = Shared()
        """
    )
    assert constructions_running(facts, _call(facts, "download")) == [_call(facts, "Captions")]
    assert constructions_running(facts, _call(facts, "fetch")) == []  # nothing calls it
    assert constructions_running(facts, _call(facts, "prepare")) == []  # another method calls it too


def test_guarded_call_takes_only_a_call_alone_on_its_line() -> None:
    from lintdist.edits import guarded_call

    facts = _facts(
        """
        state = {}
        # keep the weights
        torch.save(state, "a.pt")
        x = torch.save(state, "b.pt")
        torch.save(state, "c.pt"); done = True
        if ok: torch.save(state, "d.pt")
        """
    )
    saves = [c for c in facts.calls if facts.method_name(c) == "save"]
    wrapped = [guarded_call(facts, s, "accelerator.is_main_process") for s in saves]
    assert [w is not None for w in wrapped] == [True, False, False, False]
    guarded = cst.Module(body=[wrapped[0][1]]).code
    assert guarded == '# keep the weights\nif accelerator.is_main_process:\n    torch.save(state, "a.pt")\n'


def test_literal_binding_before_the_statement_in_its_block():
    facts = _facts(
        """
        def train():
            dims = [1, 1]
            bufs = [ids]
            later = [2]
            if flag:
                twice = [0]
            else:
                twice = [1]
            with ctx(bufs, dims, later, twice, [3], other):
                pass
            later = [2]
        """
    )
    block = facts.index.nodes(cst.With)[0]
    bufs, dims, later, twice, inline, other = [a.value for a in _call(facts, "ctx").args]
    literal, line = literal_binding(facts, dims, block, cst.List)
    assert facts.index.module.code_for_node(literal) == "[1, 1]" and isinstance(line, cst.SimpleStatementLine)
    assert literal_binding(facts, bufs, block, cst.Set) == (None, None)
    assert literal_binding(facts, later, block, cst.List) == (None, None)
    assert literal_binding(facts, twice, block, cst.List) == (None, None)
    assert literal_binding(facts, inline, block, cst.List) == (inline, None)
    assert literal_binding(facts, other, block, cst.List) == (None, None)


def test_a_statement_before_takes_over_the_leading_comments():
    module = cst.parse_module("x = 1\n\n# the loop\nfor i in y:\n    pass\n")
    loop = module.body[1]
    new = loop.with_changes(body=cst.parse_statement("for j in y:\n    pass\n").body)
    added = cst.parse_statement("z = 2\n")
    result = module.deep_replace(loop, statement_before(loop, new, added))
    assert result.code == "x = 1\n\n# the loop\nz = 2\nfor i in y:\n    pass\n"
