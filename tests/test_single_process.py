"""The program model's "only in a one-process job?" question (facts.single_process_when / single_process_branch)."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from lintdist.engine import check_text
from lintdist.registry import all_rules

LD402 = next(rule for rule in all_rules() if rule.code == "LD402")


# LD402's trigger admits a distributed file that leaves a loop after a backward pass: the facts are then built.
TRIGGER = "\nimport torch.distributed as dist\nfor batch in loader:\n    model(batch).backward()\n    if rank == 0:\n        break\n"


def _facts(source: str):
    _, context = check_text(source + TRIGGER, path=Path("t.py"), display="t.py", kind="python", rules=[LD402])
    return context.facts


def _test_of_first_if(facts):
    return next(iter(facts.index.nodes(cst.If))).test


@pytest.mark.parametrize(
    ("test", "when_true", "when_false"),
    [
        ("local_rank == -1", True, False),
        ("-1 == args.local_rank", True, False),
        ("RANK != -1", False, True),
        ("int(os.environ['LOCAL_RANK']) == -1", True, False),
        ("world_size == 1", True, False),
        ("WORLD_SIZE > 1", False, True),
        ("dist.get_world_size() <= 1", True, False),
        ("accelerator.num_processes < 2", True, False),
        ("accelerator.distributed_type == DistributedType.NO", True, False),
        ("not dist.is_initialized()", True, False),
        ("dist.is_initialized()", False, True),
        ("not args.distributed", True, False),
        ("ddp", False, True),
        ("RANK == -1 and stopper(fitness)", True, False),
        ("world_size > 1 or force", False, True),
        # not evidence of one process
        ("rank == 0", False, False),
        ("local_rank in (-1, 0)", False, False),
        ("world_size == 2", False, False),
        ("RANK == -1 or stopper(fitness)", False, False),
        ("n_gpu == 1", False, False),  # one GPU per process under DDP too
    ],
)
def test_single_process_when(test: str, when_true: bool, when_false: bool) -> None:
    facts = _facts(f"import os\nimport torch.distributed as dist\nif {test}:\n    pass\n")
    node = _test_of_first_if(facts)
    assert facts.single_process_when(node, True) is when_true
    assert facts.single_process_when(node, False) is when_false


def test_single_process_branch_reads_the_branch_taken_and_stops_at_the_function() -> None:
    facts = _facts(
        "def train(world_size):\n"
        "    for step in range(10):\n"
        "        if world_size > 1:\n"
        "            sync()\n"
        "        else:\n"
        "            lonely()\n"
        "\n"
        "if local_rank == -1:\n"
        "    def helper():\n"
        "        inside()\n"
    )
    calls = {cst.Module([]).code_for_node(c.func): c for c in facts.calls}
    assert facts.single_process_branch(calls["sync"]) is None
    assert isinstance(facts.single_process_branch(calls["lonely"]), cst.If)
    assert facts.single_process_branch(calls["inside"]) is None  # a function defined there may be called anywhere
