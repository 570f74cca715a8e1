"""As ld106_tensor_backward.py, with 3 accumulation steps and the loss divided by them by hand before the tensor
backward: the gradient is right today, and a fix that only switched to `accelerator.backward` would divide twice."""

import gc
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

GRAD_ACCUM = 3
SEEN = []  # every micro-batch the model trains on before the first optimizer step
FIRST_STEP = {}  # the gradients the first optimizer step sees


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 2, dtype=torch.float64)

    def forward(self, x, y):
        if not FIRST_STEP:
            SEEN.append({"x": x.tolist(), "y": y.tolist()})
        return F.mse_loss(self.linear(x), y)


def build_model():
    torch.manual_seed(0)
    return Regressor()


def make_data(count=24):
    generator = torch.Generator().manual_seed(1)
    features = torch.randn(count, 4, generator=generator, dtype=torch.float64)
    targets = torch.randn(count, 2, generator=generator, dtype=torch.float64)
    return features, targets


def record_first_step(optimizer, args, kwargs):
    if not FIRST_STEP:
        FIRST_STEP["grads"] = [p.grad.tolist() for group in optimizer.param_groups for p in group["params"]]


def main():
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=GRAD_ACCUM)
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.register_step_pre_hook(record_first_step)
    loader = DataLoader(TensorDataset(*make_data()), batch_size=2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    model.train()
    for x, y in loader:
        with accelerator.accumulate(model):
            loss = model(x, y)
            loss = loss / GRAD_ACCUM
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

    report = {"grads": FIRST_STEP["grads"], "seen": SEEN, "num_processes": accelerator.num_processes}
    with open(os.path.join(os.environ["PROOF_OUT"], f"rank{accelerator.process_index}.json"), "w") as out:
        json.dump(report, out)
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
