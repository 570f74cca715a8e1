"""Pitfall: an early stop decided from the local loss (LD402).

Each rank trains a DDP Linear on its own data and stops early once its own loss has not improved for
PATIENCE steps. Rank 1's loss rises from step 2 on (patience runs out at step 3); rank 0's keeps falling.
Rank 1 leaves the loop while rank 0 runs its next DDP backward.

Variants:
  broken  - local `break`; after the loop `dist.barrier()` and `dist.destroy_process_group()`.
  exit    - local `break`; the rank that broke calls `sys.exit(0)` right after the loop.
  fixed   - the stop flag is all-reduced (MAX) before the `if`, so every rank breaks at the same step.
"""

import argparse
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--variant", choices=["broken", "exit", "fixed"], default="broken")
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(16, 8)
y = torch.full((16, 1), 5.0) if rank == 0 else torch.zeros(16, 1)
PATIENCE = 2
best = float("inf")
bad_steps = 0
stopped = False

for step in range(10):
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if loss.item() < best:
        best, bad_steps = loss.item(), 0
    else:
        bad_steps += 1
    stop = torch.tensor(float(bad_steps >= PATIENCE))
    if args.variant == "fixed":
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
    if stop.item() > 0:
        stopped = True
        break

if args.variant == "exit" and stopped:
    sys.exit(0)
dist.barrier()
dist.destroy_process_group()
print(f"DONE rank={rank}")
