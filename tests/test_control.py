"""Where a node runs in the control flow (lintdist/control.py)."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.control import (
    called_in_loop,
    caller_chains,
    common_loop,
    loop_iterable,
    never_together,
    runs_only_if,
    runs_whenever,
    statement_of,
)
from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _facts(source: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(source)))
    return PythonFacts(index, NameResolver(index))


def _call(facts: PythonFacts, name: str, nth: int = 0) -> cst.Call:
    code = facts.index.module.code_for_node
    return [c for c in facts.index.nodes(cst.Call) if code(c.func) == name][nth]


def _function(facts: PythonFacts, name: str) -> cst.FunctionDef:
    return next(f for f in facts.index.nodes(cst.FunctionDef) if f.name.value == name)


SOURCE = """
def inner(batch):
    with autocast():
        loss = model(batch)
        loss.backward()


def guarded(batch):
    if batch is None:
        return
    loss.backward()


def step(batch):
    inner(batch)


def once():
    step(None)


for batch in loader:
    step(batch)
    if ready:
        optimizer.step()
"""


def test_statement_of_and_runs_whenever():
    facts = _facts(SOURCE)
    backward = _call(facts, "loss.backward")
    assert isinstance(statement_of(facts, backward), cst.SimpleStatementLine)
    assert runs_whenever(facts, backward, _function(facts, "inner").body)  # only a `with` between
    guarded = _call(facts, "loss.backward", 1)
    assert not runs_whenever(facts, guarded, _function(facts, "guarded").body)  # a return before it
    step = _call(facts, "optimizer.step")
    loop = facts.index.nodes(cst.For)[0]
    assert not runs_whenever(facts, step, loop.body)  # under an `if`


def test_common_loop_of_two_nodes_in_one_function():
    facts = _facts(SOURCE)
    loop = facts.index.nodes(cst.For)[0]
    assert common_loop(facts, _call(facts, "step", 1), _call(facts, "optimizer.step")) is loop
    assert common_loop(facts, _call(facts, "loss.backward"), _call(facts, "optimizer.step")) is None


def test_caller_chains_follow_the_calls_of_each_function():
    facts = _facts(SOURCE)
    backward = _call(facts, "loss.backward")
    chains = caller_chains(facts, backward, 2)
    code = facts.index.module.code_for_node
    found = [(code(anchor), [code(c) for c in calls]) for anchor, calls in chains]
    assert found == [
        ("loss.backward()", []),
        ("inner(batch)", ["inner(batch)"]),
        ("step(None)", ["step(None)", "inner(batch)"]),
        ("step(batch)", ["step(batch)", "inner(batch)"]),
    ]
    assert len(caller_chains(facts, backward, 1)) == 2


def test_called_in_loop_through_callers():
    facts = _facts(SOURCE)
    assert called_in_loop(facts, _function(facts, "step"), 0)
    assert called_in_loop(facts, _function(facts, "inner"), 1)
    assert not called_in_loop(facts, _function(facts, "inner"), 0)
    assert not called_in_loop(facts, _function(facts, "once"), 3)
    assert not called_in_loop(facts, None, 3)


def test_loop_iterable_unwraps_enumerate_tqdm_and_iter():
    code = cst.Module([]).code_for_node

    def iterable(text: str):
        found = loop_iterable(cst.parse_statement(f"for x in {text}:\n    pass\n"))
        return None if found is None else code(found)

    assert iterable("enumerate(tqdm(loader))") == "loader"
    assert iterable("iter(loaders['train'])") == "loaders['train']"
    assert iterable("range(10)") == "range(10)"
    assert iterable("enumerate()") is None
    assert loop_iterable(cst.parse_statement("while True:\n    pass\n")) is None


def test_never_together_reads_if_else_and_opposite_flags():
    facts = _facts(
        """
        def build(flag, cfg):
            if not flag:
                first = 1
            if flag:
                second = 2
            if cfg.eager:
                third = 3
            else:
                fourth = 4
            if flag and cfg.eager:
                fifth = 5

        def rebound(flag):
            flag = not flag
            if flag:
                sixth = 6
            if not flag:
                seventh = 7
        """
    )
    assigned = {
        a.targets[0].target.value: a for a in facts.index.nodes(cst.Assign) if a.targets[0].target.value != "flag"
    }
    assert never_together(facts, assigned["first"], assigned["second"])
    assert never_together(facts, assigned["second"], assigned["first"])
    assert never_together(facts, assigned["third"], assigned["fourth"])
    assert not never_together(facts, assigned["first"], assigned["third"])
    assert not never_together(facts, assigned["second"], assigned["fifth"])  # a compound test is not read
    assert not never_together(facts, assigned["sixth"], assigned["seventh"])  # the flag changes in between


def test_runs_only_if_reads_if_bodies_and_and_operands():
    facts = _facts(
        """
        def setup(args, other):
            if args.gradient_checkpointing:
                first = 1
            if other and args.gradient_checkpointing and ready:
                second = 2
            if not args.gradient_checkpointing:
                third = 3
            if args.gradient_checkpointing:
                pass
            else:
                fourth = 4
            if args.gradient_checkpointing or other:
                fifth = 5
        """
    )
    assigned = {a.targets[0].target.value: a for a in facts.index.nodes(cst.Assign)}
    keys = {"args.gradient_checkpointing"}
    assert runs_only_if(facts, assigned["first"], keys)
    assert runs_only_if(facts, assigned["second"], keys)
    assert not runs_only_if(facts, assigned["third"], keys)
    assert not runs_only_if(facts, assigned["fourth"], keys)
    assert not runs_only_if(facts, assigned["fifth"], keys)
