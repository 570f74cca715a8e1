"""An accelerate script that builds its GradientAccumulationPlugin for sync_each_batch and forgets the count."""

import json
import os

import torch
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin


def main():
    gradient_accumulation_steps = 4
    plugin = GradientAccumulationPlugin(sync_each_batch=True)
    accelerator = Accelerator(cpu=True, gradient_accumulation_plugin=plugin)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)

    optimizer_steps = 0
    for _ in range(2 * gradient_accumulation_steps):
        with accelerator.accumulate(model):
            accelerator.backward(model(torch.ones(1, 2)).sum())
            optimizer_steps += int(accelerator.sync_gradients)
            optimizer.step()
            optimizer.zero_grad()

    with open(os.path.join(os.environ["PROOF_OUT"], "rank0.json"), "w") as out:
        json.dump({"num_steps": accelerator.gradient_accumulation_steps, "optimizer_steps": optimizer_steps}, out)


if __name__ == "__main__":
    main()
