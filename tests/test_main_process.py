"""The program model's "which ranks run this?" questions beyond one function (lintdist.main_process)."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from lintdist.facts import PythonFacts
from lintdist.main_process import (
    main_conjuncts,
    main_only,
    main_or_deepspeed_guard,
    never_with_main,
    or_operands,
    others_branch,
    outermost_function,
    outermost_main_guard,
    under_main_guard,
)
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


def _call(facts: PythonFacts, text: str) -> cst.Call:
    module = facts.index.module
    return next(c for c in facts.calls if module.code_for_node(c) == text)


def _code(facts: PythonFacts, node: cst.CSTNode) -> str:
    return facts.index.module.code_for_node(node.test if isinstance(node, cst.If) else node).strip()


def test_main_only_in_the_function_itself_and_through_callers() -> None:
    facts = _facts(
        """
        def log_metrics(total):
            dist.all_reduce(total)

        def train(rank):
            if dist.get_rank() == 0:
                log_metrics(total)
            if rank == 0:
                dist.barrier()
            dist.broadcast(x, 0)
        """
    )
    guard, via = main_only(facts, _call(facts, "dist.all_reduce(total)"))
    assert _code(facts, guard) == "dist.get_rank() == 0"
    assert via is _call(facts, "log_metrics(total)")
    guard, via = main_only(facts, _call(facts, "dist.barrier()"))
    assert _code(facts, guard) == "rank == 0" and via is None
    assert main_only(facts, _call(facts, "dist.broadcast(x, 0)")) is None


def test_a_helper_branch_the_main_process_never_takes_is_not_main_only() -> None:
    facts = _facts(
        """
        def sync(rank):
            if rank != 0:
                dist.barrier()
            if local_rank == -1:
                dist.all_reduce(t)
            if not dist.is_initialized():
                dist.broadcast(t, 0)

        if rank == 0:
            sync(rank)
        """
    )
    for text in ("dist.barrier()", "dist.all_reduce(t)", "dist.broadcast(t, 0)"):
        call = _call(facts, text)
        assert never_with_main(facts, call)
        assert main_only(facts, call) is None


@pytest.mark.parametrize(
    ("code", "branch"),
    [
        ("if accelerator.is_main_process:\n    save()\nelse:\n    X()\n", "accelerator.is_main_process"),
        ("if rank != 0:\n    X()\n", "rank != 0"),
        ("if not accelerator.is_main_process:\n    X()\n", "not accelerator.is_main_process"),
        ("if rank == 0:\n    X()\n", None),
        ("if rank != 0 or force:\n    X()\n", None),
        ("if rank != 0:\n    def f():\n        X()\n", None),  # a function of its own
    ],
)
def test_others_branch(code: str, branch: str | None) -> None:
    facts = _facts(code)
    found = others_branch(facts, _call(facts, "X()"))
    assert (found and _code(facts, found)) == branch


@pytest.mark.parametrize(
    ("test", "found"),
    [
        ("accelerator.distributed_type == DistributedType.DEEPSPEED or accelerator.is_main_process", True),
        ("accelerator.is_main_process or accelerator.distributed_type is DistributedType.DEEPSPEED", True),
        ("accelerator.is_main_process", False),
        ("accelerator.is_main_process or force", False),
        ("accelerator.distributed_type == DistributedType.FSDP or accelerator.is_main_process", False),
    ],
)
def test_main_or_deepspeed_guard(test: str, found: bool) -> None:
    facts = _facts(f"if {test}:\n    X()\n")
    assert (main_or_deepspeed_guard(facts, _call(facts, "X()")) is not None) is found


def test_nested_main_guards() -> None:
    facts = _facts(
        """
        def train():
            if sync and accelerator.is_main_process:
                if step % k == 0:
                    if accelerator.is_main_process:
                        X()
        """
    )
    inner = next(i for i in facts.index.nodes(cst.If) if _code(facts, i) == "accelerator.is_main_process")
    outer, between = outermost_main_guard(facts, inner)
    assert _code(facts, outer) == "sync and accelerator.is_main_process"
    assert between == [inner]
    assert under_main_guard(facts, inner) and not under_main_guard(facts, outer)
    assert outermost_main_guard(facts, outer) == (outer, [])


def test_a_deepspeed_or_main_guard_encloses_too() -> None:
    facts = _facts(
        "if accelerator.distributed_type == DistributedType.DEEPSPEED or accelerator.is_main_process:\n"
        "    if step % k == 0:\n        X()\n"
    )
    inner = next(i for i in facts.index.nodes(cst.If) if _code(facts, i) == "step % k == 0")
    assert under_main_guard(facts, inner)


def test_main_conjuncts_and_or_operands() -> None:
    facts = _facts("if accelerator.is_main_process and step % k == 0 and (a and b):\n    pass\n")
    test = next(iter(facts.index.nodes(cst.If))).test
    mains, rest = main_conjuncts(facts, test)
    assert [_code(facts, m) for m in mains] == ["accelerator.is_main_process"]
    assert [_code(facts, r) for r in rest] == ["step % k == 0", "(a and b)"]
    assert main_conjuncts(facts, cst.parse_expression("accelerator.is_main_process")) == ([], [])
    operands = or_operands(cst.parse_expression("a or b or (c and d)"))
    assert [cst.Module([]).code_for_node(o) for o in operands] == ["a", "b", "(c and d)"]


def test_outermost_function() -> None:
    facts = _facts("def outer():\n    def inner():\n        X()\nY()\n")
    assert outermost_function(facts, _call(facts, "X()")).name.value == "outer"
    assert outermost_function(facts, _call(facts, "Y()")) is None


def test_main_guard_texts_want_a_rank_test_not_the_bare_word():
    from lintdist.main_process import MAIN_GUARD_TEXTS
    from lintdist.rule import _found

    def found(text: str) -> bool:
        return any(_found(trigger, text) for trigger in MAIN_GUARD_TEXTS)

    assert found("if accelerator.is_main_process:\n")
    assert found("if rank == 0:\n")
    assert found("if local_rank in [-1, 0]:\n")
    assert found("@rank_zero_only\ndef log():\n")
    assert not found("lora_rank = 8\n")  # a low-rank adapter's rank, never tested
