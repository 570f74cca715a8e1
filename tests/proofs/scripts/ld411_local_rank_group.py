"""A torchrun script that gives `init_process_group` the rank on its node (LOCAL_RANK) as its rank in the job.

Run as two "nodes" of one process each, both processes claim rank 0 of a group of two; the group never forms and
`init_process_group` fails at its (short) timeout. Each process that forms the group writes its ranks."""

import json
import os
from datetime import timedelta

import torch
import torch.distributed as dist


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=local_rank, world_size=world_size, timeout=timedelta(seconds=20))
    ranks = torch.tensor([dist.get_rank()])
    gathered = [torch.zeros_like(ranks) for _ in range(world_size)]
    dist.all_gather(gathered, ranks)
    report = {"rank": dist.get_rank(), "local_rank": local_rank, "ranks": [int(t) for t in gathered]}
    with open(os.path.join(os.environ["PROOF_OUT"], f"rank{dist.get_rank()}.json"), "w") as out:
        json.dump(report, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
