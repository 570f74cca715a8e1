"""Whether two places run in one program (``lintdist.callgraph``)."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.callgraph import reached_units, run_together, unit_of
from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex

SOURCE = """
class Trainer:
    def fit(self):
        helper()

def helper():
    pass

def setup():
    helper()

def train():
    model = wrap(model)
    setup()

def evaluate():
    for batch in loader:
        pass

def lonely():
    pass

if __name__ == "__main__":
    train()
"""


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


def _function(facts: PythonFacts, name: str) -> cst.FunctionDef:
    return facts.functions[name][0]


def test_units_are_classes_then_functions():
    facts = _facts(SOURCE)
    fit = _function(facts, "fit")
    assert isinstance(unit_of(facts, fit), cst.ClassDef)
    assert unit_of(facts, _function(facts, "helper")) is _function(facts, "helper")
    assert unit_of(facts, facts.index.nodes(cst.If)[0]) is None


def test_places_reached_from_one_root_run_together():
    facts = _facts(SOURCE)
    train, helper, evaluate = (_function(facts, n) for n in ("train", "helper", "evaluate"))
    loop = facts.index.nodes(cst.For)[0]
    assert run_together(facts, train, helper)
    assert run_together(facts, _function(facts, "fit"), helper)  # helper's unit is reached from fit  # train -> setup -> helper
    assert not run_together(facts, loop, helper)  # nothing calls both evaluate and helper
    assert run_together(facts, loop, evaluate)
    assert run_together(facts, facts.index.nodes(cst.If)[0], loop)  # module level runs with anything
    assert id(unit_of(facts, helper)) in reached_units(facts, None)
    assert id(evaluate) not in reached_units(facts, None)


def test_registered_hooks_are_handed_to_a_register_call() -> None:
    from lintdist.callgraph import registered

    index = SyntaxIndex(
        cst.parse_module(
            textwrap.dedent(
                """
                def save_hook(models, weights, output_dir):
                    pass
                def helper():
                    pass
                accelerator.register_save_state_pre_hook(save_hook)
                run(helper)
                """
            )
        )
    )
    facts = PythonFacts(index, NameResolver(index))
    hook, helper = index.nodes(cst.FunctionDef)
    assert registered(facts, hook)
    assert not registered(facts, helper)
