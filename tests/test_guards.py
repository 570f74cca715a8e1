"""Whether code runs only under a condition of some kind (``lintdist.guards``)."""

from __future__ import annotations

import re
import textwrap

import libcst as cst
from libcst.metadata import PositionProvider

from lintdist.facts import PythonFacts
from lintdist.guards import guarded_by, mentions, stops
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex

BACKEND = re.compile(r"deepspeed|distributed_?type", re.IGNORECASE)


def _guarded(code: str, target: str = "work") -> bool:
    wrapper = cst.MetadataWrapper(cst.parse_module(textwrap.dedent(code)))
    positions = wrapper.resolve(PositionProvider)
    index = SyntaxIndex(wrapper.module)
    facts = PythonFacts(index, NameResolver(index))
    call = next(c for c in facts.calls if wrapper.module.code_for_node(c.func) == target)
    return guarded_by(facts, call, BACKEND, lambda node: positions[node].start.line, 3)


def test_a_branch_on_the_condition_guards_and_its_else_too():
    assert _guarded("if not args.deepspeed:\n    work()\n")
    assert _guarded("if args.deepspeed:\n    pass\nelse:\n    work()\n")
    assert not _guarded("if args.debug:\n    work()\n")


def test_an_early_exit_or_assert_before_guards():
    assert _guarded("def main():\n    if args.deepspeed:\n        return\n    work()\n")
    assert _guarded("import sys\nif args.deepspeed:\n    sys.exit(1)\nwork()\n")
    assert _guarded("assert state.distributed_type == 'MULTI_GPU'\nwork()\n")
    assert not _guarded("work()\nif args.deepspeed:\n    raise SystemExit\n")


def test_a_helper_that_raises_guards_but_one_that_returns_does_not():
    raises = "def check():\n    if args.deepspeed:\n        raise ValueError\ncheck()\nwork()\n"
    returns = "def check():\n    if args.deepspeed:\n        return\ncheck()\nwork()\n"
    assert _guarded(raises)
    assert not _guarded(returns)


def test_every_caller_guarded_and_names_followed_back():
    assert _guarded("def run():\n    work()\nif not args.deepspeed:\n    run()\n")
    assert not _guarded("def run():\n    work()\nif not args.deepspeed:\n    run()\nrun()\n")
    assert _guarded("plain = not args.deepspeed\nok = plain and True\nif ok:\n    work()\n")


def test_stops():
    body = cst.parse_statement("if x:\n    return 1\n").body
    assert stops(body) and not stops(body, returns=False)
    assert stops(cst.parse_statement("if x:\n    quit()\n").body, returns=False)
    index = SyntaxIndex(cst.parse_module("x = 1\n"))
    facts = PythonFacts(index, NameResolver(index))
    assert mentions(facts, cst.parse_expression("'deepspeed' in cfg"), BACKEND)


def test_branch_tests_are_the_tests_around_a_node_within_its_function():
    from lintdist.guards import branch_tests

    code = textwrap.dedent(
        """
        def load(ddp, quantized):
            if quantized:
                choice = {"": rank} if ddp else "auto"
            while waiting:
                other = "x"
            return "auto" if flag else None
        if outer:
            def inner():
                return 1
        """
    )
    module = cst.parse_module(code)
    index = SyntaxIndex(module)
    facts = PythonFacts(index, NameResolver(index))
    words = {}
    for node in facts.index.nodes(cst.SimpleString):
        tests = branch_tests(facts, node)
        words.setdefault(node.value, []).append([module.code_for_node(t) for t in tests])
    assert words['"auto"'] == [["ddp", "quantized"], ["flag"]]
    assert words['"x"'] == [["waiting"]]
    integer = next(iter(facts.index.nodes(cst.Integer)))
    assert branch_tests(facts, integer) == []  # the `if outer:` around the def is outside the function
    ifexp = next(iter(facts.index.nodes(cst.IfExp)))
    assert [module.code_for_node(t) for t in branch_tests(facts, ifexp.test)] == ["quantized"]
