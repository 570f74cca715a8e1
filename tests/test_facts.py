"""The facts' questions that several rules ask: each answered once here, tested on small scripts."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


def _call(facts: PythonFacts, text: str) -> cst.Call:
    """The first call whose callee reads ``text``."""
    module = facts.index.module
    return next(c for c in facts.calls if module.code_for_node(c.func) == text)


# -- the Accelerator as spelled at a point -------------------------------------------------------


def test_accelerator_used_in_the_same_function_is_named_as_written():
    facts = _facts(
        """
        from accelerate import Accelerator

        def main():
            accelerator = Accelerator()
            model = accelerator.prepare(model)
            torch.save(model.state_dict(), "m.pt")
        """
    )
    assert facts.accelerator_at(_call(facts, "torch.save")) == "accelerator"


def test_accelerator_in_a_method_is_the_attribute_the_class_sets():
    facts = _facts(
        """
        from accelerate import Accelerator

        class Runner:
            def __init__(self):
                self.accelerator = Accelerator()

            def save(self, model):
                torch.save(model.state_dict(), "m.pt")

            @staticmethod
            def export(model):
                torch.save(model, "x.pt")
        """
    )
    saves = [c for c in facts.calls if facts.index.module.code_for_node(c.func) == "torch.save"]
    assert facts.accelerator_at(saves[0]) == "self.accelerator"
    assert facts.accelerator_at(saves[1]) is None  # a static method has no `self`


def test_a_module_level_accelerator_is_seen_from_a_function_unless_it_rebinds_the_name():
    facts = _facts(
        """
        from accelerate import Accelerator

        accelerator = Accelerator()

        def save(model):
            torch.save(model.state_dict(), "m.pt")

        def other(model):
            accelerator = make()
            torch.save(model, "x.pt")
        """
    )
    saves = [c for c in facts.calls if facts.index.module.code_for_node(c.func) == "torch.save"]
    assert facts.accelerator_at(saves[0]) == "accelerator"
    assert facts.accelerator_at(saves[1]) is None


def test_an_accelerator_known_by_its_module_level_use_is_seen_from_a_function():
    facts = _facts(
        """
        from lib import acc

        acc.wait_for_everyone()
        if acc.is_main_process:
            acc.save_state("ckpt")

        def save(model):
            torch.save(model, "x.pt")
        """
    )
    assert facts.accelerator_at(_call(facts, "torch.save")) == "acc"


def test_an_accelerator_used_only_inside_a_function_is_not_in_sight_at_module_level():
    facts = _facts(
        """
        from accelerate import Accelerator

        def main():
            accelerator = Accelerator()
            accelerator.wait_for_everyone()

        torch.save(model, "x.pt")
        """
    )
    assert facts.accelerator_at(_call(facts, "torch.save")) is None
