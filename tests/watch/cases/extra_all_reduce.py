"""Pitfall: a collective that only one rank calls (LD405).

Every step all-reduces a tensor holding rank + 1 (the sum is 3 with two ranks).

Variants:
  broken   - at step 2 rank 0 alone calls one extra `dist.all_reduce(extra)`; from then on rank 0 is one
             collective ahead of rank 1.
  control  - at step 2 both ranks call `dist.broadcast(t, src=0)`, from two different lines: the same
             collective on every rank, so the job completes.
"""

import argparse

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--variant", choices=["broken", "control"], default="broken")
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
weights = torch.randn(4, 4)
results = []

for step in range(6):
    t = torch.full((4,), float(rank + 1))
    if step == 2:
        if args.variant == "broken":
            if rank == 0:
                extra = torch.full((4,), 10.0)
                dist.all_reduce(extra)
        else:
            if rank == 0:
                dist.broadcast(t, src=0)
            else:
                dist.broadcast(t, src=0)
    dist.all_reduce(t)
    results.append(t[0].item())
    weights = weights @ torch.tanh(weights) / 4

dist.barrier()
dist.destroy_process_group()
print(f"DONE rank={rank}")
