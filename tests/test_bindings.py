"""Which names code binds and reads, rebinding between two points, repeatable expressions (lintdist/bindings.py)."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from lintdist.bindings import (
    BINDERS,
    arithmetic,
    attribute_assignments,
    bound_names,
    read_names,
    rebinds_any,
    rebound_between,
    repeatable,
    variable_names,
)
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


def test_variable_names_skip_attribute_names():
    facts = _facts("x = outputs.loss + w * batch[key].aux\n")
    assert variable_names(facts, facts.index.nodes(cst.Assign)[0].value) == {"outputs", "w", "batch", "key"}


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("outputs.loss", True),
        ("0.1 * -aux[0] / n", True),
        ("batch[0].y", True),
        ("batch['x']", False),
        ("batch[1:]", False),
        ("f(x)", False),
        ("a if b else c", False),
    ],
)
def test_arithmetic(text, answer):
    assert arithmetic(cst.parse_expression(text)) is answer


@pytest.mark.parametrize(
    ("statement", "answer"),
    [
        ("loss = 2", True),
        ("self.loss = loss.detach()", False),
        ("outputs.loss = 0", True),
        ("a, *rest = pair", True),
        ("loss.mul_(2)", True),
        ("loss.mul(2)", False),
        ("with ctx() as loss: pass", True),
        ("del other", True),
        ("log(loss)", False),
        ("for outputs in xs: pass", True),
    ],
)
def test_rebinds_any(statement, answer):
    facts = _facts(statement + "\n")
    assert rebinds_any(facts, facts.index.module.body[0], {"loss", "outputs", "rest"}) is answer


def test_attribute_assignments_by_attribute_name():
    facts = _facts(
        """
        args.ddp_find_unused_parameters = True
        cfg.train.ddp_find_unused_parameters = False
        ddp_find_unused_parameters = True
        a.ddp_find_unused_parameters = b.ddp_find_unused_parameters = True
        args.other = 1
        """
    )
    code = facts.index.module.code_for_node
    found = [code(a.targets[0].target) for a in attribute_assignments(facts, ("ddp_find_unused_parameters",))]
    assert found == ["args.ddp_find_unused_parameters", "cfg.train.ddp_find_unused_parameters"]
