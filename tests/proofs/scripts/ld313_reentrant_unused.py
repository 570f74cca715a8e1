"""A two-block model whose first block runs under activation checkpointing, wrapped in DDP with
`find_unused_parameters=True`, trained for 2 steps on 2 gloo ranks; each rank reports the first error (if any)."""

import json
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        hidden = checkpoint(self.block, x, use_reentrant=True)
        return self.head(hidden)


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(Net(), find_unused_parameters=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    error = None
    steps = 0
    try:
        for step in range(2):
            x = torch.randn(8, 4, requires_grad=True)
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
    except RuntimeError as exc:
        error = str(exc)
    weights = [p.detach().flatten().tolist() for p in model.parameters()]
    with open(os.path.join(os.environ["PROOF_OUT"], f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "error": error, "steps": steps, "weights": weights}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
