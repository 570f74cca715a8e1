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
parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
parser.add_argument("--leaver", type=int, default=1, help="the rank whose loss stops improving")
args = parser.parse_args()

dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
rank = dist.get_rank()
device = torch.device("cuda", rank % torch.cuda.device_count()) if args.device == "cuda" else torch.device("cpu")
torch.manual_seed(0)
model = DistributedDataParallel(nn.Linear(8, 1).to(device))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(16, 8).to(device)
y = (torch.zeros(16, 1) if rank == args.leaver else torch.full((16, 1), 5.0)).to(device)
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
    stop = torch.tensor(float(bad_steps >= PATIENCE), device=device)
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
