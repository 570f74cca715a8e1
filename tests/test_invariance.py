"""What a loop leaves alone (lintdist/invariance.py)."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.invariance import (
    ancestors_inside,
    assigned_keys,
    fixed_name,
    range_start,
    read_keys,
    rebound_between,
    rebound_in,
    same_each_pass,
)
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _facts(source: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(source)))
    return PythonFacts(index, NameResolver(index))


SOURCE = """
resume = args.resume_step
loader = make()
loader = other()
for epoch in range(args.start, 10):
    if resume is not None and args.flag:
        skip(loader, resume)
    count += 1
    state.step = count
    total = count
    if len(x):
        pass
"""


def _loop(facts: PythonFacts) -> cst.For:
    return facts.loops[0]


def test_assigned_keys_are_targets_and_their_attributes_with_the_loop_counter():
    facts = _facts(SOURCE)
    keys = assigned_keys(facts, _loop(facts))
    assert {"epoch", "count", "state.step", "state"} <= keys
    assert "resume" not in keys and "loader" not in keys


def test_read_keys_are_whole_chains():
    facts = _facts(SOURCE)
    test = _loop(facts).body.body[0].test
    assert read_keys(facts, test) == {"resume", "args.flag", "None"}


def test_same_each_pass_refuses_calls_and_rebound_names():
    facts = _facts(SOURCE)
    loop = _loop(facts)
    first, *_, last = [s for s in loop.body.body if isinstance(s, cst.If)]
    assert same_each_pass(facts, first.test, loop)
    assert not same_each_pass(facts, last.test, loop)  # a call
    assert not same_each_pass(facts, cst.parse_expression("count > 3"), loop)
    assert same_each_pass(facts, cst.parse_expression("3"), loop)


def test_rebound_in_and_between():
    facts = _facts(SOURCE)
    loop = _loop(facts)
    first, second = [a for a in facts.index.nodes(cst.Assign) if getattr(a.targets[0].target, "value", "") == "loader"]
    assert rebound_between(facts, "loader", first, loop)
    assert not rebound_between(facts, "loader", second, loop)
    assert rebound_in(facts, "total", loop, besides=loop)
    assert not rebound_in(facts, "resume", loop, besides=loop)


def test_range_start_reads_the_first_value_unless_the_loop_changes_it():
    facts = _facts(SOURCE)
    loop = _loop(facts)
    counter, start = range_start(loop, set())
    assert counter == "epoch" and cst.Module([]).code_for_node(start) == "args.start"
    assert range_start(loop, {"args.start"}) is None
    plain = _facts("for i in range(5):\n    pass\n").loops[0]
    assert range_start(plain, set())[1].value == "0"
    assert range_start(_facts("for i in items:\n    pass\n").loops[0], set()) is None


def test_ancestors_inside_stop_at_the_container():
    facts = _facts(SOURCE)
    loop = _loop(facts)
    call = next(c for c in facts.calls if cst.ensure_type(c.func, cst.Name).value == "skip")
    found = ancestors_inside(facts, call, loop)
    assert loop not in found and any(isinstance(a, cst.If) for a in found)


def test_fixed_name_is_a_name_or_chain_the_loop_leaves_bound():
    facts = _facts(
        """
        sampler = make()
        for epoch in range(3):
            loader = build()
            use(sampler, loader, args.data, make())
        """
    )
    (loop,) = facts.within(facts.index.module, cst.For)
    (call,) = [c for c in facts.calls if facts.method_name(c) == "use"]
    sampler, loader, attribute, made = (arg.value for arg in call.args)
    assert fixed_name(facts, sampler, loop) == "sampler"
    assert fixed_name(facts, attribute, loop) == "args.data"
    assert fixed_name(facts, loader, loop) is None  # rebound in every pass
    assert fixed_name(facts, made, loop) is None  # not a name
