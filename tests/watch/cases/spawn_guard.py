"""Pitfall: a collective under a rank test, in a script that starts its ranks with `torch.multiprocessing.spawn` (LD405).

Run as `python -m lintdist.runtime.watch spawn_guard.py --variant broken`: the watcher follows the spawned processes.

Variants:
  broken  - at step 2, `if rank == 0:` then `dist.barrier()`; rank 1 goes on to the next all_reduce.
  fixed   - the barrier on every rank.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def train(rank: int, world_size: int, variant: str, port: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    total = torch.zeros(2)
    for step in range(5):
        total += torch.full((2,), float(rank + step))
        dist.all_reduce(total)
        if step == 2 and (variant == "fixed" or rank == 0):
            dist.barrier()
    dist.barrier()
    dist.destroy_process_group()
    print(f"DONE rank={rank}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", choices=["broken", "fixed"], default="broken")
    parser.add_argument("--port", default="29533")
    args = parser.parse_args()
    mp.spawn(train, args=(2, args.variant, args.port), nprocs=2)
