"""Which names code binds and reads, rebinding between two points, repeatable expressions (lintdist/bindings.py)."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from lintdist.bindings import BINDERS, bound_names, read_names, rebound_between, repeatable
from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _facts(source: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(source)))
    return PythonFacts(index, NameResolver(index))


def test_bound_names_of_every_binder():
    facts = _facts(
        """
        a, self.b = f()
        c += 1
        d: int = 2
        for e, g in pairs:
            pass
        with open(p) as h, lock:
            pass
        del i, j.k
        (m := 3)
        """
    )
    found = [sorted(bound_names(facts, node)) for node in facts.index.nodes(*BINDERS)]
    assert ["a", "b", "self", "self.b"] in found  # the attribute name is read as a name too
    assert ["c"] in found and ["d"] in found and ["e", "g"] in found
    assert ["h"] in found and [] in found  # `lock` binds nothing
    assert ["i", "j", "j.k", "k"] in found and ["m"] in found


def test_read_names_are_dotted():
    facts = _facts("x = (step + 1) % self.accum == 0\n")
    test = facts.index.nodes(cst.Assign)[0].value
    assert read_names(facts, test) == {"step", "self", "self.accum", "accum"}


def test_rebound_between_positions_and_in_helpers_for_attributes():
    facts = _facts(
        """
        class Trainer:
            def bump(self):
                self.micro += 1

            def train(self):
                start()
                self.bump()
                micro = 0
                gate()
        """
    )
    order = facts.index.order
    train = next(f for f in facts.index.nodes(cst.FunctionDef) if f.name.value == "train")
    calls = {facts.index.module.code_for_node(c.func): c for c in facts.index.nodes(cst.Call)}
    start, gate = order(calls["start"]), order(calls["gate"])
    assert rebound_between(facts, {"micro"}, train, start, gate)
    assert not rebound_between(facts, {"micro"}, train, start, order(calls["self.bump"]))
    assert rebound_between(facts, {"self.micro"}, train, start, gate)  # in the helper called there
    assert not rebound_between(facts, {"other"}, train, start, gate)


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("(step + 1) % accum == 0", True),
        ("micro == min(len(loader), max_steps)", True),
        ("next(counter) % 4 == 0", False),
        ("(n := n + 1) % 4 == 0", False),
        ("self.should_step()", False),
    ],
)
def test_repeatable(text, answer):
    facts = _facts(f"x = {text}\n")
    assert repeatable(facts, facts.index.nodes(cst.Assign)[0].value) is answer
