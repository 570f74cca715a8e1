"""lintdist/surrounding_tests.py: the ``if``/``while`` statements whose branch holds a node."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.surrounding_tests import surrounding_tests
from lintdist.syntax import SyntaxIndex


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


def _call(facts: PythonFacts, name: str) -> cst.Call:
    return next(c for c in facts.calls if facts.method_name(c) == name)


def _tests(facts: PythonFacts, found) -> list[str]:
    return [cst.Module([]).code_for_node(branch.test) for branch in found]


def test_innermost_first_body_and_else_up_to_the_function():
    facts = _facts(
        """
        if outer:
            def train():
                while running:
                    if a:
                        pass
                    elif b:
                        if c:
                            work()
        """
    )
    found = surrounding_tests(facts, _call(facts, "work"))
    assert _tests(facts, found) == ["c", "b", "a"]  # the `elif` is the `else` of `if a:`; no `while`, no `outer`
    found = surrounding_tests(facts, _call(facts, "work"), kinds=(cst.If, cst.While))
    assert _tests(facts, found) == ["c", "b", "a", "running"]


def test_a_node_in_the_test_is_not_under_it_and_until_stops_the_walk():
    facts = _facts(
        """
        for batch in loader:
            if check():
                if done():
                    break
        """
    )
    assert _tests(facts, surrounding_tests(facts, _call(facts, "check"))) == []
    loop = next(iter(facts.index.nodes(cst.For)))
    brk = next(iter(facts.index.nodes(cst.Break)))
    assert _tests(facts, surrounding_tests(facts, brk, until=loop)) == ["done()", "check()"]
    inner = facts.index.nodes(cst.If)
    assert _tests(facts, surrounding_tests(facts, brk, until=[i for i in inner][0])) == ["done()"]


def test_scopes_are_boundaries_unless_told_otherwise():
    facts = _facts(
        """
        if ready:
            handler = lambda: fire()
        """
    )
    assert surrounding_tests(facts, _call(facts, "fire")) == []
    found = surrounding_tests(facts, _call(facts, "fire"), scopes=(cst.FunctionDef, cst.ClassDef))
    assert _tests(facts, found) == ["ready"]
