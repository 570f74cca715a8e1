"""An accelerate script resumed two batches into its first epoch: the skipping loader replaces the loader."""

import gc
import json
import os

import torch
import torch.distributed as dist
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset


def main(num_epochs=3, starting_epoch=0, resume_step=2):
    accelerator = Accelerator(cpu=True)
    features = torch.arange(32, dtype=torch.float32).unsqueeze(1)
    dataset = TensorDataset(features, features * 2.0)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    train_dataloader = DataLoader(dataset, batch_size=4, shuffle=True)
    model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)

    if resume_step:
        train_dataloader = accelerator.skip_first_batches(train_dataloader, resume_step)

    batches_per_epoch = []
    for epoch in range(starting_epoch, num_epochs):
        batches = 0
        for x, y in train_dataloader:
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
            batches += 1
        batches_per_epoch.append(batches)

    with open(os.path.join(os.environ["PROOF_OUT"], f"rank{accelerator.process_index}.json"), "w") as out:
        json.dump({"batches": batches_per_epoch, "world": accelerator.num_processes}, out)
    accelerator.wait_for_everyone()
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
