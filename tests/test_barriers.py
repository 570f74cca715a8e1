"""Whether the other ranks wait for the main process between two places (lintdist.barriers)."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.barriers import (
    barrier_between,
    barrier_spelling,
    guarded_places,
    never_together,
    synchronises,
    unwaited,
)
from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


def _calls(facts: PythonFacts, prefix: str) -> list[cst.Call]:
    module = facts.index.module
    return [c for c in facts.calls if module.code_for_node(c).startswith(prefix)]


def test_synchronises_knows_barriers_object_collectives_and_helpers() -> None:
    facts = _facts(
        """
        import torch
        def sync_all():
            dist.barrier()
        accelerator.wait_for_everyone()
        fabric.barrier()
        dist.broadcast_object_list(objects)
        sync_all()
        comm.synchronize()
        torch.cuda.synchronize()
        dist.all_reduce(t)
        """
    )
    names = {facts.index.module.code_for_node(c): synchronises(facts, c) for c in facts.calls}
    assert names == {
        "dist.barrier()": True,
        "accelerator.wait_for_everyone()": True,
        "fabric.barrier()": True,
        "dist.broadcast_object_list(objects)": True,
        "sync_all()": True,
        "comm.synchronize()": True,
        "torch.cuda.synchronize()": False,
        "dist.all_reduce(t)": False,
    }


def test_guarded_places_follow_callers_and_note_the_guard() -> None:
    facts = _facts(
        """
        def write():
            torch.save(state, "m.pt")
        def main():
            if accelerator.is_main_process:
                write()
            write()
        """
    )
    (save,) = _calls(facts, "torch.save")
    places = guarded_places(facts, save, 3)
    shown = [(facts.index.module.code_for_node(node), guarded) for node, guarded in places]
    assert shown == [('torch.save(state, "m.pt")', False), ("write()", False), ("write()", True)]
    assert [guarded for _, guarded in guarded_places(facts, save, 3, unguarded_only=True)] == [False, False]
    assert len(guarded_places(facts, save, 0)) == 1


def test_unwaited_finds_a_main_only_write_followed_by_a_read_with_no_barrier() -> None:
    facts = _facts(
        """
        if rank == 0:
            torch.save(state, "m.pt")
        torch.load("m.pt")
        if rank == 0:
            torch.save(state, "n.pt")
        dist.barrier()
        torch.load("n.pt")
        """
    )
    first_save, second_save = _calls(facts, "torch.save")
    first_load, second_load = _calls(facts, "torch.load")
    reads = guarded_places(facts, first_load, 3, unguarded_only=True)
    assert unwaited(facts, guarded_places(facts, first_save, 3), False, reads) == (first_save, first_load)
    later = guarded_places(facts, second_load, 3, unguarded_only=True)
    assert unwaited(facts, guarded_places(facts, second_save, 3), False, later) is None
    assert barrier_between(facts, second_save, second_load)
    assert not barrier_between(facts, first_save, first_load)


def test_never_together_is_a_branch_pair_that_is_not_a_rank_test() -> None:
    facts = _facts(
        """
        if resume:
            torch.save(state, "a.pt")
        else:
            torch.load("a.pt")
        if rank == 0:
            torch.save(state, "b.pt")
        else:
            torch.load("b.pt")
        """
    )
    (save_a, save_b), (load_a, load_b) = _calls(facts, "torch.save"), _calls(facts, "torch.load")
    assert never_together(facts, save_a, load_a)
    assert not never_together(facts, save_b, load_b)


def test_barrier_spelling_follows_the_script() -> None:
    accelerate = _facts(
        """
        from accelerate import Accelerator
        accelerator = Accelerator()
        torch.load("m.pt")
        """
    )
    assert barrier_spelling(accelerate, accelerate.calls[-1]) == (
        "accelerator.wait_for_everyone()",
        (),
        "accelerator.wait_for_everyone()",
    )
    torch_only = _facts(
        """
        import torch.distributed as dist
        torch.load("m.pt")
        """
    )
    assert barrier_spelling(torch_only, torch_only.calls[-1])[0] == "dist.barrier()"


def test_main_process_first_entered_after_a_main_only_write_waits_for_it():
    # accelerate's `main_process_first`: the other processes enter only once the main process has left the block,
    # and the main process wrote the file before entering it.
    source = """
from accelerate import Accelerator
accelerator = Accelerator()
if accelerator.is_main_process:
    torch.save(state, "w.pth")
with accelerator.main_process_first():
    state = torch.load("w.pth")
with accelerator.local_main_process_first():
    state = torch.load("w.pth")
"""
    facts = _facts(source)
    save = next(c for c in facts.calls if facts.method_name(c) == "save")
    first_load, second_load = [c for c in facts.calls if facts.method_name(c) == "load"]
    assert barrier_between(facts, save, first_load)
    assert not barrier_between(facts, save, second_load)  # other nodes' local main processes do not wait
