"""Validation on rank 0 alone with a DDP model that holds a BatchNorm buffer (gloo, CPU).

Each rank runs two training steps, then rank 0 evaluates under `torch.no_grad()` and every rank meets at a
barrier. DDP's forward broadcasts the module buffers from rank 0 when the previous forward ran with gradients on,
so rank 0's validation forward waits for the other rank in that broadcast. Each rank writes what it saw to
$PROOF_OUT/rank<R>.json before the barrier. The process group times out after a few seconds, so a rank left
waiting fails fast.
"""

import json
import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

OUT = Path(os.environ["PROOF_OUT"])

dist.init_process_group("gloo", timeout=timedelta(seconds=6))
rank = dist.get_rank()
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
model = DDP(net)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

for step in range(2):
    loss = model(torch.randn(16, 4)).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()

report = {"trained": True}
if rank == 0:
    with torch.no_grad():
        report["val"] = round(float(model(torch.randn(8, 4)).mean()), 6)
(OUT / f"rank{rank}.json").write_text(json.dumps(report))
dist.barrier()
dist.destroy_process_group()
