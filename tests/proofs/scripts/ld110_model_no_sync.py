"""accelerate MULTI_CPU: hand-written accumulation that calls the prepared model's own no_sync.

Each rank records its local gradient after every micro-batch and the gradient at each optimizer step. On the
micro-batches under no_sync the ranks must hold different (unsynced) gradients; after the last micro-batch of a
window they must agree.
"""

import gc
import json
import os

import torch
from accelerate import Accelerator

ACCUM = 3
MICRO_BATCHES = 9
LR = 0.05


def flat_grad(module):
    return torch.cat([p.grad.detach().flatten() for p in module.parameters()]).tolist()


def main():
    accelerator = Accelerator(cpu=True)
    rank, world = accelerator.process_index, accelerator.num_processes
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(world, MICRO_BATCHES, 4, 6, generator=generator, dtype=torch.float64)
    targets = torch.randn(world, MICRO_BATCHES, 4, 1, generator=generator, dtype=torch.float64)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.ReLU(), torch.nn.Linear(6, 1)).double()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    model, optimizer = accelerator.prepare(model, optimizer)

    micro_grads, step_grads = [], []
    for step in range(MICRO_BATCHES):
        x, y = features[rank, step], targets[rank, step]
        if (step + 1) % ACCUM != 0:
            with model.no_sync():
                loss = torch.nn.functional.mse_loss(model(x), y) / ACCUM
                accelerator.backward(loss)
        else:
            loss = torch.nn.functional.mse_loss(model(x), y) / ACCUM
            accelerator.backward(loss)
        micro_grads.append(flat_grad(accelerator.unwrap_model(model)))
        if (step + 1) % ACCUM == 0:
            step_grads.append(flat_grad(accelerator.unwrap_model(model)))
            optimizer.step()
            optimizer.zero_grad()

    report = {
        "world": world,
        "distributed_type": str(accelerator.distributed_type),
        "micro_grads": micro_grads,
        "step_grads": step_grads,
    }
    with open(os.path.join(os.environ["PROOF_OUT"], f"rank{rank}.json"), "w") as out:
        json.dump(report, out)
    accelerator.wait_for_everyone()
    del model
    gc.collect()
    accelerator.end_training()


if __name__ == "__main__":
    main()
