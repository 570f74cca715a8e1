"""What a use can receive, and who reads a value (lintdist/receivers.py)."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.receivers import never_received, only_consumer, receiving_calls
from lintdist.syntax import SyntaxIndex


def _facts(source: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(source)))
    return PythonFacts(index, NameResolver(index))


def _calls(facts: PythonFacts, name: str) -> list[cst.Call]:
    return [c for c in facts.calls if cst.Module([]).code_for_node(c.func).endswith(name)]


def _order(facts: PythonFacts):
    return facts.index.order


def test_never_received_from_the_other_branch_or_a_later_line():
    facts = _facts(
        """
        def main():
            if ddp:
                loader = Raw()
            else:
                loader = Plain()
                use(loader)
            late = Late()
            for step in steps:
                use(step)
                again = Again()
        """
    )
    (raw,), (plain,), (late,), (again,) = (_calls(facts, n) for n in ("Raw", "Plain", "Late", "Again"))
    first_use, loop_use = _calls(facts, "use")
    assert never_received(facts, raw, first_use, _order(facts))
    assert not never_received(facts, plain, first_use, _order(facts))
    assert never_received(facts, late, first_use, _order(facts))
    assert not never_received(facts, again, loop_use, _order(facts))  # the loop runs it before the next use


def test_only_consumer():
    facts = _facts(
        """
        loader = DataLoader(ds)
        loader = accelerator.prepare(loader)
        print(loader)
        other = DataLoader(ds)
        other_prepared = accelerator.prepare(other)
        print(other)
        accelerator.prepare(DataLoader(ds))
        """
    )
    first, second, third = _calls(facts, "DataLoader")
    p1, p2, p3 = _calls(facts, "prepare")
    line = facts.index.order
    assert only_consumer(facts, first, p1, line)
    assert not only_consumer(facts, second, p2, line)
    assert only_consumer(facts, third, p3, line)


def test_receiving_calls_follow_names_and_keep_to_the_keyword():
    facts = _facts(
        """
        from accelerate import Accelerator, ParallelismConfig

        config = ParallelismConfig(cp_size=2)
        other = ParallelismConfig(cp_size=4)
        first = Accelerator(parallelism_config=config)
        second = Accelerator(parallelism_config=config if big else other)
        third = Accelerator(config)
        fourth = Accelerator(parallelism_config=other)
        """
    )
    config, other = _calls(facts, "ParallelismConfig")
    classes = frozenset({"accelerate.Accelerator"})
    found = receiving_calls(facts, config, classes, "parallelism_config")
    assert [cst.Module([]).code_for_node(call.func) for call, _ in found] == ["Accelerator", "Accelerator"]
    assert [arg.keyword.value for _, arg in found] == ["parallelism_config", "parallelism_config"]
    assert len(receiving_calls(facts, other, classes, "parallelism_config")) == 2
    assert receiving_calls(facts, config, classes, "fsdp_plugin") == []
    assert receiving_calls(facts, config, frozenset({"accelerate.Other"}), "parallelism_config") == []
