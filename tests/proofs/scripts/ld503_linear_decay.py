"""A linear decay with warmup sized in optimizer steps (the prepared loader's length), prepared with accelerate.

Run on 2 gloo ranks (MULTI_CPU): each rank writes the learning rate after every optimizer step to
``$PROOF_OUT/rank<R>.json``.
"""

import json
import os

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset
from transformers import get_linear_schedule_with_warmup

EPOCHS = 2
WARMUP = 2
BASE_LR = 0.1


def main():
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=BASE_LR)
    dataset = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    loader = DataLoader(dataset, batch_size=4, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    # each rank's batches per epoch: the prepared loader is already split across the processes
    total_steps = EPOCHS * len(loader)
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=WARMUP, num_training_steps=total_steps)
    scheduler = accelerator.prepare(scheduler)

    lrs = []
    for epoch in range(EPOCHS):
        for inputs, targets in loader:
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            lrs.append(scheduler.get_last_lr()[0])

    report = {
        "num_processes": accelerator.num_processes,
        "distributed_type": accelerator.distributed_type.value,
        "planned_steps": total_steps,
        "lrs": lrs,
    }
    with open(os.path.join(os.environ["PROOF_OUT"], f"rank{accelerator.process_index}.json"), "w") as out:
        json.dump(report, out)


if __name__ == "__main__":
    main()
