"""The training-thread hooks of `lintdist.runtime.watch` in one process: the best of 3 DDP loops without them,
then with them, and how many gradient checksums they queued. Used by a test (few steps: the checks run) and by
benchmarks/watch_cost.py (1,500 steps: what they cost).

    python hook_cost.py PORT [STEPS]
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 1500
torch.set_num_threads(1)
dist.init_process_group("gloo", rank=0, world_size=1)


def loop(steps: int = STEPS) -> float:
    torch.manual_seed(0)
    layers = nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 256), nn.Linear(256, 1))
    model = nn.parallel.DistributedDataParallel(layers)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(8, 64, 256)
    start = time.perf_counter()
    for step in range(steps):
        model(data[step % 8]).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return time.perf_counter() - start


plain = [loop() for _ in range(3)]
from lintdist.runtime.watch.checks import Checks  # noqa: E402  (installed after the plain loops on purpose)

checks = Checks(lambda: 2)  # as on 2 ranks: the gradient checksums run too
checks.install()
hooked = [loop() for _ in range(3)]
print(min(plain), min(hooked), len(checks.outbox))
dist.destroy_process_group()
