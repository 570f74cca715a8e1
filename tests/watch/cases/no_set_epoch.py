"""Pitfall: a shuffling DistributedSampler without `set_epoch` (LD201).

Without `sampler.set_epoch(epoch)` the sampler reuses the seed of epoch 0, so every epoch visits the
same order on every rank.

Variants:
  broken          - DistributedSampler(shuffle=True), no set_epoch.
  set_epoch       - `sampler.set_epoch(epoch)` first in the epoch loop.
  no_shuffle      - DistributedSampler(shuffle=False): a fixed order is what was asked for.
  accelerate      - plain DataLoader(shuffle=True) through `accelerator.prepare`, no set_epoch call.
  runtime_helper  - `lintdist.runtime.set_epoch(loader, epoch)` first in the epoch loop.
"""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

VARIANTS = ["broken", "set_epoch", "no_shuffle", "accelerate", "runtime_helper"]
parser = argparse.ArgumentParser()
parser.add_argument("--variant", choices=VARIANTS, default="broken")
args = parser.parse_args()

torch.manual_seed(0)
dataset = TensorDataset(torch.arange(32, dtype=torch.float32).unsqueeze(1), torch.randn(32, 1))
model = nn.Linear(1, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.001)

if args.variant == "accelerate":
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    loader = DataLoader(dataset, batch_size=4, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    rank = accelerator.process_index
else:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    sampler = DistributedSampler(dataset, shuffle=args.variant != "no_shuffle")
    loader = DataLoader(dataset, batch_size=4, sampler=sampler)
    model = DistributedDataParallel(model)

for epoch in range(3):
    if args.variant == "set_epoch":
        sampler.set_epoch(epoch)
    elif args.variant == "runtime_helper":
        from lintdist.runtime import set_epoch

        set_epoch(loader, epoch)
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        if args.variant == "accelerate":
            accelerator.backward(loss)
        else:
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()

if args.variant != "accelerate":
    dist.destroy_process_group()
print(f"DONE rank={rank}")
