"""Pitfall: the data-parallel split of a DataLoader (LD203 / LD204).

Dataset of 64 samples, batch size 4, two ranks.

Variants:
  no_sampler           - raw DDP, `DataLoader(shuffle=True)` without a sampler and the same seed on every
                         rank: every rank draws the same batches (LD203).
  distributed          - raw DDP with `DistributedSampler`: each rank gets its own half (correct).
  prepare_distributed  - accelerate: a DataLoader built with `sampler=DistributedSampler(ds)` passed
                         through `accelerator.prepare`, which shards it again (LD204).
  prepare_plain        - accelerate: a plain DataLoader through `accelerator.prepare` (correct).
"""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

VARIANTS = ["no_sampler", "distributed", "prepare_distributed", "prepare_plain"]
parser = argparse.ArgumentParser()
parser.add_argument("--variant", choices=VARIANTS, default="no_sampler")
args = parser.parse_args()

torch.manual_seed(0)
dataset = TensorDataset(torch.arange(64, dtype=torch.float32).unsqueeze(1), torch.randn(64, 1))
model = nn.Linear(1, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.0001)
use_accelerate = args.variant.startswith("prepare")

if use_accelerate:
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    if args.variant == "prepare_distributed":
        sampler = DistributedSampler(dataset)
        loader = DataLoader(dataset, batch_size=4, sampler=sampler)
    else:
        loader = DataLoader(dataset, batch_size=4, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    rank = accelerator.process_index
else:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if args.variant == "distributed":
        sampler = DistributedSampler(dataset)
        loader = DataLoader(dataset, batch_size=4, sampler=sampler)
    else:
        loader = DataLoader(dataset, batch_size=4, shuffle=True)
    model = DistributedDataParallel(model)

seen = 0
for x, y in loader:
    seen += len(x)
    loss = nn.functional.mse_loss(model(x), y)
    if use_accelerate:
        accelerator.backward(loss)
    else:
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()

if not use_accelerate:
    dist.destroy_process_group()
print(f"DONE rank={rank}")
