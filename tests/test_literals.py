"""What a literal says (lintdist/literals.py): truth, counts of at most one, and literal mappings."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from lintdist.facts import PythonFacts
from lintdist.literals import (
    at_most_one,
    dict_key,
    is_mapping_call,
    is_name,
    literal_truth,
    mapping_entry,
    readable_mapping,
)
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _facts(source: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(source)))
    return PythonFacts(index, NameResolver(index))


@pytest.mark.parametrize(
    ("text", "truth"),
    [
        ("True", True),
        ("False", False),
        ("None", False),
        ('"full_shard"', True),
        ('""', False),
        ("0", False),
        ("2", True),
        ("[]", False),
        ('["full_shard", "auto_wrap"]', True),
        ("()", False),
        ("args.fsdp", None),
        ("flag", None),
        ("f()", None),
    ],
)
def test_literal_truth_reads_only_literals(text, truth):
    assert literal_truth(cst.parse_expression(text)) is truth


def test_is_constant_names_one_constant():
    assert is_name(cst.parse_expression("None"), "None")
    assert not is_name(cst.parse_expression("None"), "False")
    assert not is_name(cst.parse_expression('"None"'), "None")
    assert not is_name(None, "None")


def test_at_most_one_follows_names_bound_only_to_small_literals():
    facts = _facts(
        """
        ONE = 1
        if fast:
            MIXED = 1
        else:
            MIXED = 4
        ZERO_OR_ONE = 0 if x else 1
        use(ONE, MIXED, ZERO_OR_ONE, 1, 0, 2, args.steps, unbound)
        """
    )
    call = facts.index.nodes(cst.Call)[-1]
    answers = [at_most_one(arg.value, facts, call) for arg in call.args]
    assert answers == [True, False, True, True, True, False, False, False]


def test_mapping_entries_of_dicts_and_config_calls():
    config = cst.parse_expression('{"gradient_accumulation_kwargs": {"sync_each_batch": False}, 3: 4}')
    inner = mapping_entry(config, "gradient_accumulation_kwargs")
    assert isinstance(inner, cst.Dict)
    assert is_name(mapping_entry(inner, "sync_each_batch"), "False")
    assert mapping_entry(config, "other") is None
    assert dict_key(config.elements[1]) is None
    call = cst.parse_expression("AcceleratorConfig(split_batches=True, gradient_accumulation_kwargs=kwargs)")
    assert is_mapping_call(call, "AcceleratorConfig")
    assert not is_mapping_call(cst.parse_expression("dict(a=1)"), "AcceleratorConfig")
    assert isinstance(mapping_entry(call, "gradient_accumulation_kwargs"), cst.Name)
    assert mapping_entry(cst.parse_expression("name"), "key") is None


def test_readable_mapping_refuses_unpacking():
    assert readable_mapping(cst.parse_expression('{"a": 1}'))
    assert not readable_mapping(cst.parse_expression('{"a": 1, **rest}'))
    assert readable_mapping(cst.parse_expression("Config(a=1)"))
    assert not readable_mapping(cst.parse_expression("Config(a=1, **rest)"))
    assert not readable_mapping(cst.parse_expression("name"))
