"""A raw torch.distributed (DDP, gloo) training loop that stops early on a value each rank measures for itself.

Rank r's monitored validation loss is (1 + r) / (step + 1): it falls under the target at step 5 on rank 0 and
at step 10 on rank 1. Every step runs a DDP backward (an all-reduce of the gradients). Each rank writes the step
it stopped at to $PROOF_OUT/rank<R>.json before the closing barrier. The process group times out after a few
seconds, so a rank left waiting fails fast instead of hanging for 30 minutes.
"""

import json
import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

OUT = Path(os.environ["PROOF_OUT"])
TARGET = 0.2

dist.init_process_group("gloo", timeout=timedelta(seconds=6))
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

stopped_at = None
for step in range(30):
    inputs = torch.randn(8, 4)
    loss = model(inputs).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    val_loss = (1 + rank) / (step + 1)
    stopped_at = step
    if val_loss < TARGET:
        break

(OUT / f"rank{rank}.json").write_text(json.dumps({"stopped_at": stopped_at}))
dist.barrier()
dist.destroy_process_group()
