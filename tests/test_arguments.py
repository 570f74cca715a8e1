"""``lintdist.arguments``: what ``args.<name>`` holds when the launch does not pass it."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.arguments import command_line_default, values_passed
from lintdist.facts import PythonFacts, string_value
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _default(code: str, read: str) -> str | None:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    facts = PythonFacts(index, NameResolver(index))
    return string_value(command_line_default(facts, cst.parse_expression(read)))


PARSER = """
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("-s", "--lr-scheduler", default="constant")
    parser.add_argument("--mode", dest="run_mode", default="fast")
    parser.add_argument("--name")
    args = parser.parse_args()
"""


def test_a_long_flag_with_dashes_names_its_destination():
    assert _default(PARSER, "args.lr_scheduler") == "constant"


def test_dest_wins_over_the_flag():
    assert _default(PARSER, "args.run_mode") == "fast"
    assert _default(PARSER, "args.mode") is None


def test_no_default_or_no_declaration_is_unknown():
    assert _default(PARSER, "args.name") is None
    assert _default(PARSER, "args.other") is None
    assert _default(PARSER, "lr_scheduler") is None


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


def test_declared_options_and_parsed_namespaces():
    from lintdist.arguments import declared_options, holds_parsed_arguments, parsed_namespace_names

    facts = _facts(PARSER + "    opts, rest = parser.parse_known_args()\n    other = load()\n")
    assert declared_options(facts) == {"lr_scheduler", "run_mode", "name"}
    assert parsed_namespace_names(facts) == {"args", "opts"}
    end = facts.calls[-1]
    assert holds_parsed_arguments(facts, "args", end)
    assert holds_parsed_arguments(facts, "opts", end)
    assert not holds_parsed_arguments(facts, "rest", end)
    assert not holds_parsed_arguments(facts, "other", end)


def test_passed_arg_by_keyword_or_position():
    from lintdist.arguments import passed_arg

    call = cst.parse_expression("DataLoader(ds, 8, True, **kw, sampler=s)")
    assert passed_arg(call, "shuffle", 2).value.value == "True"
    assert passed_arg(call, "sampler", 3).keyword.value == "sampler"
    assert passed_arg(cst.parse_expression("DataLoader(ds, *rest, True)"), "shuffle", 1) is None
    assert passed_arg(cst.parse_expression("DataLoader(ds)"), "shuffle", 2) is None


def _passed(code: str, names: list[str]) -> list[tuple[str | None, ...]] | None:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    facts = PythonFacts(index, NameResolver(index))
    body = next(c for c in facts.calls if facts.method_name(c) == "DataLoader")
    rows = values_passed(facts, names, body)
    code_for = index.module.code_for_node
    return None if rows is None else [tuple(None if v is None else code_for(v) for v in row) for row in rows]


BUILD = """
def build(ds, shuffle=True, sampler=None):
    return DataLoader(ds, shuffle=shuffle, sampler=sampler)
"""


def test_values_passed_gives_each_calls_arguments_or_the_defaults():
    calls = BUILD + "build(a)\nbuild(a, False, s)\nbuild(a, sampler=t)\n"
    assert _passed(calls, ["shuffle", "sampler"]) == [("True", "None"), ("False", "s"), ("True", "t")]
    assert _passed(BUILD, ["shuffle", "sampler"]) == []  # no call in sight


def test_values_passed_is_none_for_a_name_that_is_no_parameter_or_a_starred_call():
    assert _passed(BUILD + "build(a)\n", ["shuffle", "epochs"]) is None
    assert _passed(BUILD + "build(a, **options)\n", ["shuffle", "sampler"]) is None
