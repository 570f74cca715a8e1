"""What bounds a loop, and which loops surround given calls (lintdist/loop_bounds.py)."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.loop_bounds import assigned_from, bounding_test, loop_bounds, loops_around
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _facts(source: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(source)))
    return PythonFacts(index, NameResolver(index))


SOURCE = """
def train_one_epoch(loader):
    for batch in loader:
        optimizer.step()
        scheduler.step()

def main(args):
    budget = args.max_steps
    step = 0
    while step < budget:
        train_one_epoch(loader)
        step += 1
    for epoch in tqdm(range(args.epochs)):
        for batch in loader:
            scheduler.step()
            if completed >= args.max_train_steps:
                break
"""


def _steps(facts: PythonFacts) -> list[cst.Call]:
    code = facts.index.module.code_for_node
    return [c for c in facts.calls if facts.method_name(c) == "step" and "scheduler" in code(c)]


def test_loops_around_reach_the_callers_of_the_function_holding_the_call():
    facts = _facts(SOURCE)
    loops = loops_around(facts, _steps(facts))
    code = facts.index.module.code_for_node
    heads = [code(loop.iter) if isinstance(loop, cst.For) else code(loop.test) for loop in loops]
    assert heads == ["loader", "loader", "tqdm(range(args.epochs))", "step < budget"]
    assert not any(isinstance(loop, cst.While) for loop in loops_around(facts, _steps(facts), rounds=1))


def test_loop_bounds_name_ranges_tests_and_breaks():
    facts = _facts(SOURCE)
    loops = loops_around(facts, _steps(facts))
    outer = loops[2]
    assert [names for names, _ in loop_bounds(facts, outer)] == [
        {"range", "args", "args.epochs", "epochs"},
        {"completed", "args", "args.max_train_steps", "max_train_steps"},
    ]
    assert isinstance(loop_bounds(facts, loops[1])[0][1], cst.If)


def test_bounding_test_follows_plain_aliases():
    facts = _facts(SOURCE)
    loops = loops_around(facts, _steps(facts))
    assert assigned_from(facts)["args.max_steps"] == {"budget"}
    assert isinstance(bounding_test(facts, "args.max_steps", loops), cst.While)
    assert isinstance(bounding_test(facts, "args.max_train_steps", loops), cst.If)
    assert isinstance(bounding_test(facts, "args.epochs", loops), cst.For)
    assert bounding_test(facts, "args.lr", loops) is None
