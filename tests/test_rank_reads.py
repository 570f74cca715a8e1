"""Whether code reads the process's rank in any form (lintdist.rank_reads)."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.rank_reads import launching_process_only, rank_tested, reads_rank
from lintdist.syntax import SyntaxIndex


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


def test_reads_rank_in_names_getters_strings_and_bindings() -> None:
    facts = _facts(
        """
        suffix = f"_{dist.get_rank()}"
        torch.save(a, f"ckpt{args.local_rank}.pt")
        torch.save(b, "ckpt" + suffix)
        torch.save(c, os.environ["RANK"] + ".pt")
        torch.save(d, "ckpt.pt")
        torch.save(e, name)
        """
    )
    saves = [c for c in facts.calls if facts.method_name(c) == "save"]
    assert [reads_rank(facts, s.args[1].value, s) for s in saves] == [True, True, True, False, False]
    assert not reads_rank(facts, None, saves[0])


def test_rank_tested_around_the_node_or_every_call_of_its_function() -> None:
    facts = _facts(
        """
        def save():
            torch.save(state, "a.pt")
        if args.rank % ngpus_per_node == 0:
            save()
        def other():
            torch.save(state, "b.pt")
        if args.rank % ngpus_per_node == 0:
            other()
        other()
        if epoch % 2 == 0:
            torch.save(state, "c.pt")
        """
    )
    saves = [c for c in facts.calls if facts.method_name(c) == "save" and c.args]
    assert [rank_tested(facts, s) for s in saves] == [True, False, False]


def test_every_rank_callers_none_under_a_rank_test_or_in_a_hook():
    from lintdist.rank_reads import every_rank_callers

    facts = _facts(
        """
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model)
        torch.save(model.state_dict(), "every.pt")
        if dist.get_rank() == 0:
            torch.save(model.state_dict(), "first.pt")

        def hook(models, weights, output_dir):
            torch.save(weights, "hook.pt")

        accelerator.register_save_state_pre_hook(hook)
        """
    )
    saves = {facts.index.module.code_for_node(c.args[1].value): c for c in facts.calls if len(c.args) == 2}
    assert every_rank_callers(facts, saves['"every.pt"']) == []  # this module sets the run up
    assert every_rank_callers(facts, saves['"first.pt"']) is None
    assert every_rank_callers(facts, saves['"hook.pt"']) is None


def test_every_rank_callers_none_in_a_module_that_sets_up_no_run():
    from lintdist.rank_reads import every_rank_callers

    facts = _facts("import torch\n\ndef save(model):\n    torch.save(model.state_dict(), 'm.pt')\n")
    call = next(c for c in facts.calls if facts.method_name(c) == "save")
    assert every_rank_callers(facts, call) is None  # no caller elsewhere sets up processes


def test_launching_process_only_under_main_and_in_its_helpers() -> None:
    facts = _facts(
        """
        import torch.multiprocessing as mp
        import wandb

        def worker(rank, run):
            wandb.init(project="worker")

        def start_tracking():
            return wandb.init(project="helper")

        wandb.init(project="import time")
        if __name__ == "__main__":
            run = wandb.init(project="parent")
            other = start_tracking()
            mp.spawn(worker, args=(run,), nprocs=2)
        """
    )
    inits = [c for c in facts.calls if facts.method_name(c) == "init"]
    projects = [facts.index.module.code_for_node(c.args[0].value) for c in inits]
    assert dict(zip(projects, (launching_process_only(facts, c) for c in inits))) == {
        '"worker"': False,
        '"helper"': True,
        '"import time"': False,
        '"parent"': True,
    }


def test_launching_process_only_needs_a_spawn_in_the_file() -> None:
    facts = _facts(
        """
        import wandb

        if __name__ == "__main__":
            wandb.init(project="torchrun runs this on every rank")
        """
    )
    assert [launching_process_only(facts, c) for c in facts.calls if facts.method_name(c) == "init"] == [False]
