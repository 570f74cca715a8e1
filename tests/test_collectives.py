"""The program model's "is this call a collective?" question (lintdist.collectives)."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from lintdist.collectives import (
    collective_kind,
    is_barrier,
    joined_by_others,
    main_joins,
    on_sub_group,
    same_collective,
)
from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


def _last_call(facts: PythonFacts) -> cst.Call:
    """The outermost call of the last statement."""
    last = facts.index.module.body[-1]
    while not isinstance(last, cst.SimpleStatementLine):
        last = last.body.body[-1]
    return next(c for c in facts.calls if facts.is_within(c, last) and not isinstance(facts.parent(c), cst.Arg))


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        ("import torch.distributed as dist\ndist.all_reduce(t)\n", "always"),
        ("from torch.distributed import all_reduce as ar\nar(t)\n", "always"),
        ("import torch\ntorch.distributed.barrier()\n", "always"),
        ("import torch.distributed.checkpoint as dcp\ndcp.save(state, checkpoint_id=d)\n", "always"),
        ("from accelerate.utils import gather_object\ngather_object(rows)\n", "always"),
        ("from accelerate import Accelerator\naccelerator = Accelerator()\naccelerator.gather(x)\n", "always"),
        ("from accelerate import Accelerator\naccelerator = Accelerator()\naccelerator.save_state(d)\n", "sharded"),
        ("from accelerate import PartialState\nstate = PartialState()\nstate.wait_for_everyone()\n", "always"),
        # an unresolved receiver in an accelerate script: an accelerate-only method, or a name saying so
        ("import accelerate\nself.helper.wait_for_everyone()\n", "always"),
        ("import accelerate\nself.accelerator.get_state_dict(m)\n", "sharded"),
        ("import deepspeed\nengine, *_ = deepspeed.initialize(model=m)\nengine.save_checkpoint(d)\n", "always"),
        (
            "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType\n"
            "with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT):\n    model.state_dict()\n",
            "always",
        ),
        # not collectives
        ("import torch.distributed as dist\ndist.send(t, dst=1)\n", None),
        ("import torch.distributed as dist\ndist.all_reduce(t, group=first_node)\n", None),
        ("from accelerate.utils import gather\ngather(t, no_dist=True)\n", None),
        ("import torch\ntorch.save(sd, path)\n", None),
        ("model.state_dict()\n", None),
        ("self.helper.wait_for_everyone()\n", None),  # no accelerate in sight
        ("import accelerate\nself.helper.gather(x)\n", None),  # `gather` alone is too common a name
        ("engine.save_checkpoint(d)\n", None),
    ],
)
def test_collective_kind(code: str, kind: str | None) -> None:
    facts = _facts(code)
    assert collective_kind(facts, _last_call(facts)) == kind


def test_every_barrier_spelling_is_one_collective_and_other_calls_go_by_name() -> None:
    facts = _facts(
        "import torch.distributed as dist\n"
        "dist.barrier()\naccelerator.wait_for_everyone()\ndist.monitored_barrier()\n"
        "dist.gather(t, out, dst=0)\ndist.gather(t, dst=0)\ndist.all_reduce(t)\n"
    )
    barrier, wait, monitored, gather_root, gather, reduce = facts.calls
    assert all(is_barrier(facts, c) for c in (barrier, wait, monitored))
    assert not is_barrier(facts, gather)
    assert same_collective(facts, barrier, wait) and same_collective(facts, wait, monitored)
    assert same_collective(facts, gather_root, gather)
    assert not same_collective(facts, gather, reduce) and not same_collective(facts, barrier, reduce)


@pytest.mark.parametrize(
    ("arguments", "sub_group"),
    [("t", False), ("t, group=None", False), ("t, group=dist.group.WORLD", False), ("t, group=pg", True)],
)
def test_on_sub_group(arguments: str, sub_group: bool) -> None:
    call = cst.parse_expression(f"dist.all_reduce({arguments})")
    assert on_sub_group(call) is sub_group


def _calls(facts: PythonFacts, text: str) -> list[cst.Call]:
    module = facts.index.module
    return [c for c in facts.calls if module.code_for_node(c) == text]


def test_the_rank_0_first_pair_is_joined_on_both_sides() -> None:
    facts = _facts(
        """
        import torch.distributed as dist

        def prepare(rank):
            if rank != 0:
                dist.barrier()
            build_cache()
            if rank == 0:
                dist.barrier()
        """
    )
    others, main = _calls(facts, "dist.barrier()")
    assert joined_by_others(facts, main) and not joined_by_others(facts, others)
    assert main_joins(facts, others)


def test_a_root_collective_in_both_branches_is_joined() -> None:
    facts = _facts(
        """
        import torch.distributed as dist

        def collect(rank):
            if rank == 0:
                dist.gather(t, out, dst=0)
            else:
                dist.gather(t, dst=0)
        """
    )
    main, others = facts.calls
    assert joined_by_others(facts, main)
    assert main_joins(facts, others)


def test_a_collective_only_one_side_makes_is_not_joined() -> None:
    facts = _facts(
        """
        import torch.distributed as dist

        def log(rank):
            if local_rank in [-1, 0] and verbose:
                dist.all_reduce(t)
                if local_rank not in [-1, 0]:
                    dist.all_reduce(t)  # dead: only the main process gets here

        def wait(accelerator):
            if accelerator.is_main_process:
                write_report()
            else:
                accelerator.wait_for_everyone()

        def other():
            accelerator.wait_for_everyone()  # another function
        """
    )
    main, dead, others, elsewhere = facts.calls[0], facts.calls[1], facts.calls[3], facts.calls[4]
    names = [facts.method_name(c) for c in (main, dead, others, elsewhere)]
    assert names == ["all_reduce", "all_reduce", "wait_for_everyone", "wait_for_everyone"]
    assert not joined_by_others(facts, main)
    assert not main_joins(facts, others)


def test_may_gather_by_name_and_state_dicts_when_sharded() -> None:
    from lintdist.collectives import may_gather

    facts = _facts(
        """
        torch.save(accelerator.get_state_dict(model), "a.pt")
        torch.save(model.state_dict(), "b.pt")
        torch.save({"step": step}, "c.pt")
        """
    )
    saves = [c for c in facts.calls if facts.method_name(c) == "save"]
    assert [may_gather(facts, s, False) for s in saves] == [True, False, False]
    assert [may_gather(facts, s, True) for s in saves] == [True, True, False]
    assert not may_gather(facts, None, True)
    wrapped = _facts(
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = FSDP(net)
        torch.save(model.state_dict(), "b.pt")
        """
    )
    assert may_gather(wrapped, _last_call(wrapped), False)


def _project_facts(tmp_path, files: dict[str, str], main: str) -> PythonFacts:
    from lintdist.project import Project, ProjectView

    for name, code in files.items():
        (tmp_path / name).write_text(textwrap.dedent(code))
    facts = _facts((tmp_path / main).read_text())
    facts.project = ProjectView(Project(), tmp_path / main)
    return facts


def test_collective_elsewhere_follows_a_helper_of_another_module(tmp_path):
    from lintdist.collectives import collective_elsewhere

    helpers = """
        import torch.distributed as dist

        def log_metrics(total):
            if dist.get_rank() != 0:
                dist.barrier()
            dist.all_reduce(total)

        def plain(total):
            print(total)
        """
    main = "import helpers\nhelpers.log_metrics(t)\nhelpers.plain(t)\nprint(t)\n"
    facts = _project_facts(tmp_path, {"helpers.py": helpers, "train.py": main}, "train.py")
    calls = {cst.Module([]).code_for_node(c): c for c in facts.calls}
    found = collective_elsewhere(facts, calls["helpers.log_metrics(t)"])
    assert found is not None
    other, inner, kind = found
    # the barrier under `!= 0` is never reached by the main process: the all_reduce is the first
    assert (other.method_name(inner), kind) == ("all_reduce", "always")
    assert collective_elsewhere(facts, calls["helpers.plain(t)"]) is None
    assert collective_elsewhere(facts, calls["print(t)"]) is None
    facts.project = None
    assert collective_elsewhere(facts, calls["helpers.log_metrics(t)"]) is None


def test_others_only_collectives_are_those_the_main_process_never_joins():
    from lintdist.collectives import others_only_collectives

    facts = _facts(
        """
        import torch.distributed as dist

        def wait_alone(rank):
            if rank == 0:
                write()
            else:
                dist.barrier()
                dist.all_reduce(t)

        def first_pair(rank):
            if rank != 0:
                dist.barrier()
            build()
            if rank == 0:
                dist.barrier()
        """
    )
    found = others_only_collectives(facts)
    assert [(facts.method_name(call), type(branch).__name__) for call, branch in found] == [("barrier", "If")]
    assert cst.Module([]).code_for_node(found[0][1].test) == "rank == 0"


def test_collective_texts_find_a_collective_by_its_name_only():
    from lintdist.collectives import COLLECTIVE_TEXTS
    from lintdist.rule import _found

    def found(text: str) -> bool:
        return any(_found(trigger, text) for trigger in COLLECTIVE_TEXTS)

    assert found("dist.all_reduce(t)")
    assert found("with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT):")
    assert found("import torch.distributed.checkpoint as dcp")
    assert not found("model.state_dict()")  # a collective only inside `state_dict_type(...)`
    assert not found("all_reduced = 3")


def test_combined_value_of_a_collective_and_of_a_helper_that_combines_its_parameter():
    from lintdist.collectives import combined_value

    facts = _facts(
        """
        import torch.distributed as dist

        def reduce_tensor(tensor, world_size):
            rt = tensor.clone()
            dist.all_reduce(rt)
            return rt / world_size

        def log(value):
            print(value)

        dist.all_reduce(a)
        dist.all_gather(out, b)
        reduce_tensor(c, 2)
        log(d)
        """
    )
    code = facts.index.module.code_for_node
    sent = {code(call): combined_value(facts, call) for call in facts.calls}
    assert code(sent["dist.all_reduce(a)"]) == "a"
    assert code(sent["dist.all_gather(out, b)"]) == "b"
    assert code(sent["reduce_tensor(c, 2)"]) == "c"
    assert sent["log(d)"] is None
