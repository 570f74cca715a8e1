"""``lintdist.in_sight``: names that hold a value at a place, and the one value a name pattern picks there."""

from __future__ import annotations

import re
import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.in_sight import holds_value, named_value_in_sight
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex

COUNT = re.compile(r"accum_steps|grad_accum", re.IGNORECASE)


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


def _target(facts: PythonFacts) -> cst.Call:
    return next(c for c in facts.calls if facts.method_name(c) == "Plugin")


def test_a_parameter_and_an_earlier_assignment_hold_a_value():
    facts = _facts(
        """
        def build(accum_steps):
            lr = 1
            Plugin()
            later = 2
        """
    )
    at = _target(facts)
    assert holds_value(facts, "accum_steps", at)
    assert holds_value(facts, "lr", at)
    assert not holds_value(facts, "later", at)


def test_an_assignment_under_an_if_does_not_hold_on_every_path():
    facts = _facts(
        """
        if flag:
            accum_steps = 4
        Plugin()
        """
    )
    assert not holds_value(facts, "accum_steps", _target(facts))
    assert named_value_in_sight(facts, _target(facts), COUNT) is None


def test_a_module_variable_read_from_a_function_holds():
    facts = _facts(
        """
        def build():
            return Plugin()

        accum_steps = 4
        """
    )
    assert named_value_in_sight(facts, _target(facts), COUNT) == "accum_steps"


def test_two_candidates_or_a_flag_give_no_value():
    two = _facts(
        """
        accum_steps = 4
        grad_accum = 2
        Plugin()
        """
    )
    assert named_value_in_sight(two, _target(two), COUNT) is None
    flag = _facts(
        """
        grad_accum = True
        Plugin()
        """
    )
    assert named_value_in_sight(flag, _target(flag), COUNT) is None


def test_a_parsed_option_is_read_from_its_namespace():
    facts = _facts(
        """
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument("--grad-accum", type=int)
        args, _ = parser.parse_known_args()
        Plugin()
        """
    )
    assert named_value_in_sight(facts, _target(facts), COUNT) == "args.grad_accum"


def test_a_namespace_from_elsewhere_is_not_read():
    facts = _facts(
        """
        parser.add_argument("--grad-accum", type=int)
        args = load_config()
        Plugin()
        """
    )
    assert named_value_in_sight(facts, _target(facts), COUNT) is None
