"""lintdist/process_group.py: when a script starts its process group, and how code names its accelerator."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.process_group import (
    group_started_after,
    group_started_before,
    script_framework,
    state_can_start_at,
    state_expression_at,
)
from lintdist.syntax import SyntaxIndex


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


def _statement(facts: PythonFacts, text: str) -> cst.SimpleStatementLine:
    """The first simple statement line whose code holds ``text``."""
    module = facts.index.module
    return next(s for s in facts.index.nodes(cst.SimpleStatementLine) if text in module.code_for_node(s))


def test_script_framework_tells_accelerate_torch_lightning_and_plain_scripts_apart():
    assert script_framework(_facts("from accelerate import Accelerator\nAccelerator()\n")) == "accelerate"
    assert script_framework(_facts("import torch.distributed as dist\ndist.init_process_group('nccl')\n")) == "torch"
    assert script_framework(_facts("import torch.multiprocessing as mp\nmp.spawn(main)\n")) == "torch"
    lightning = "import lightning as L\nimport torch.distributed as dist\nL.Trainer()\ndist.barrier()\n"
    assert script_framework(_facts(lightning)) is None
    assert script_framework(_facts("import torch\ntorch.zeros(1)\n")) is None


def test_the_group_starts_before_after_or_at_unknown_callers():
    facts = _facts(
        """
        import torch.distributed as dist

        def setup():
            dist.init_process_group("nccl")

        def helper():
            data = load()

        def main():
            early = load()
            setup()
            late = load()
            helper()

        def orphan():
            lonely = load()

        main()
        """
    )
    assert group_started_before(facts, _statement(facts, "early")) is False
    assert not group_started_after(facts, _statement(facts, "early"))  # only a start in its own function counts
    assert group_started_before(facts, _statement(facts, "late")) is True
    assert not group_started_after(facts, _statement(facts, "late"))
    assert group_started_before(facts, _statement(facts, "data")) is True  # before its only call site
    assert group_started_before(facts, _statement(facts, "lonely")) is None


def test_a_group_started_later_in_the_same_function():
    facts = _facts(
        """
        import torch.distributed as dist

        def main():
            first = load()
            dist.init_process_group("nccl")
            second = load()
        """
    )
    assert group_started_after(facts, _statement(facts, "first"))
    assert not group_started_after(facts, _statement(facts, "second"))
    assert group_started_before(facts, _statement(facts, "second")) is True


def test_the_accelerator_expression_and_whether_it_may_be_none():
    facts = _facts(
        """
        from accelerate import Accelerator

        accelerator = Accelerator() if multi else None

        def build(acc: Accelerator):
            a = acc.prepare(x)

        def maybe(acc=None):
            b = load()

        def main():
            c = load()

        maybe(accelerator)
        main()
        """
    )
    assert state_expression_at(facts, _statement(facts, "a =")) == ("acc", False)
    assert state_expression_at(facts, _statement(facts, "c =")) == ("accelerator", True)
    assert state_expression_at(facts, _statement(facts, "b =")) == ("acc", True)


def test_an_accelerator_bound_after_the_statement_is_not_in_reach():
    facts = _facts(
        """
        from accelerate import Accelerator, PartialState

        tokens = load()
        accelerator = Accelerator(mixed_precision="bf16")
        """
    )
    statement = _statement(facts, "tokens")
    assert state_expression_at(facts, statement) is None
    assert state_can_start_at(facts, statement)


def test_a_state_that_reaches_the_process_group_cannot_start_early():
    facts = _facts(
        """
        from accelerate import Accelerator

        tokens = load()
        accelerator = Accelerator(cpu=True)
        """
    )
    assert not state_can_start_at(facts, _statement(facts, "tokens"))
