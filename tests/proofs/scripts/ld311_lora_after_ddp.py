"""LoRA adapters injected after the DDP wrap (argv[1] == "after") or before it ("before"), then 3 SGD steps on
rank-dependent data; each rank reports its adapter weights.

peft is not a test dependency, so ``inject_lora`` does what peft's ``LoraModel._create_and_replace`` does to a
``nn.Linear``: it replaces the layer in its parent by a module that keeps the old layer as ``base_layer`` and adds
two new trainable ``nn.Parameter``s (``lora_A`` random, ``lora_B`` zeros), and freezes every other parameter
(``BaseTuner._mark_only_adapters_as_trainable``). peft's own injection follows the same path: new parameters
created on each rank, after whatever DDP registered at construction.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


class LoraLinear(nn.Module):
    def __init__(self, base: nn.Linear, r: int = 2) -> None:
        super().__init__()
        self.base_layer = base
        self.lora_A = nn.Parameter(torch.empty(r, base.in_features))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, r))
        nn.init.kaiming_uniform_(self.lora_A, a=5**0.5)

    def forward(self, x):
        return self.base_layer(x) + x @ self.lora_A.t() @ self.lora_B.t()


def inject_lora(model: nn.Module) -> nn.Module:
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    for name, child in list(model.named_children()):
        if isinstance(child, nn.Linear):
            setattr(model, name, LoraLinear(child))
    return model


def main() -> None:
    order = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)  # each rank its own adapter init, as when seeds differ or are drawn per rank
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    if order == "before":
        model = DistributedDataParallel(inject_lora(model))
    else:
        model = DistributedDataParallel(model)
        inject_lora(model.module)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    error = None
    try:
        for step in range(3):
            x = torch.randn(16, 4, generator=torch.Generator().manual_seed(100 * rank + step))
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    except RuntimeError as exc:
        error = str(exc).splitlines()[0]
    adapters = {n: p.detach().flatten().tolist() for n, p in model.module.named_parameters() if "lora_" in n}
    with open(os.path.join(os.environ["PROOF_OUT"], f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "adapters": adapters, "error": error}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
