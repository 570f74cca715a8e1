"""Resume an FSDP1 run's Adam state on 2 gloo CPU ranks, for the LD605 proof.

One Adam step is taken, the optimizer state is gathered with ``FSDP.optim_state_dict`` (a full, unflattened
state dict on every rank), and a fresh model and optimizer "resume" from it. The resume converts the saved
state with ``FSDP.optim_state_dict_to_load`` and drops the result, the mistake LD605 reports: the fresh
optimizer's ``state`` stays empty.
``use_orig_params=False``: with ``True``, torch 2.13's ``FSDP.optim_state_dict`` on gloo CPU ranks returned
``exp_avg`` equal to ``exp_avg_sq`` in a trial run, which would blur the comparison.
Each rank writes what it sees to ``$PROOF_OUT/rank<R>.json``.
"""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


def build() -> tuple[FSDP, torch.optim.Optimizer]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    model = FSDP(net, device_id=torch.device("cpu"), use_orig_params=False)
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def exp_avgs(optim: torch.optim.Optimizer) -> list[list[float]]:
    return [state["exp_avg"].tolist() for state in optim.state.values() if "exp_avg" in state]


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    model, optim = build()
    batch = torch.randn(4, 8, generator=torch.Generator().manual_seed(rank))
    model(batch).pow(2).mean().backward()
    optim.step()
    saved = exp_avgs(optim)
    osd = FSDP.optim_state_dict(model, optim)

    model, optim = build()
    FSDP.optim_state_dict_to_load(model, optim, osd)

    report = {"saved": saved, "resumed": exp_avgs(optim), "state_entries": len(optim.state)}
    with open(os.path.join(os.environ["PROOF_OUT"], f"rank{rank}.json"), "w") as handle:
        json.dump(report, handle)
    # every rank leaves its last collective before any rank tears the group down (one CI run aborted in
    # teardown with "terminate called without an active exception" when rank 0 got there first)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
