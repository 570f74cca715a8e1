"""An optimizer built from `model.parameters()` before the model is wrapped (argv[1]: "fsdp1" wraps with
`FullyShardedDataParallel` and its default `use_orig_params=False`, "fsdp2" with `fully_shard`), then 3 SGD steps
on 2 gloo CPU ranks; each rank reports whether the wrapped model's weights changed and how many of the optimizer's
tensors got a gradient."""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, fully_shard


def snapshot(model: nn.Module) -> torch.Tensor:
    """Every weight the wrapped model computes with, gathered whole (FSDP2's parameters are sharded DTensors)."""
    with torch.no_grad():
        return torch.cat(
            [(p.full_tensor() if hasattr(p, "full_tensor") else p.detach().clone()).reshape(-1) for p in model.parameters()]
        )


def build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))


def with_fsdp1():
    model = build()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model = FSDP(model, device_id=torch.device("cpu"))
    return model, optimizer


def with_fsdp2():
    model = build()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    fully_shard(model)
    return model, optimizer


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, optimizer = with_fsdp1() if sys.argv[1] == "fsdp1" else with_fsdp2()
    before = snapshot(model)
    graded = 0
    for step in range(3):
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(10 * rank + step))
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        graded = sum(p.grad is not None for group in optimizer.param_groups for p in group["params"])
        optimizer.step()
    changed = not torch.equal(before, snapshot(model))
    with open(os.path.join(os.environ["PROOF_OUT"], f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "changed": changed, "graded": graded}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
