"""The no_trainer shape: a step budget given on the command line, or derived from the loader before `prepare`,
sizes a linear decay that goes through `accelerator.prepare`; the loop stops after that many optimizer steps.

Run on 2 gloo ranks (MULTI_CPU), with or without ``--max_train_steps N``: each rank writes the learning rate after
every optimizer step to ``$PROOF_OUT/rank<R>.json``.
"""

import argparse
import json
import os

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset
from transformers import get_linear_schedule_with_warmup

BASE_LR = 0.1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--max_train_steps", type=int, default=None)
    parser.add_argument("--num_train_epochs", type=int, default=2)
    args = parser.parse_args()

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=BASE_LR)
    loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=4, shuffle=True)

    updates_per_epoch = len(loader)  # un-sharded: 16 batches
    if args.max_train_steps is None:
        args.max_train_steps = args.num_train_epochs * updates_per_epoch
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=0, num_training_steps=args.max_train_steps)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    lrs = []
    for epoch in range(args.num_train_epochs):
        for inputs, targets in loader:
            accelerator.backward(torch.nn.functional.mse_loss(model(inputs), targets))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            lrs.append(scheduler.get_last_lr()[0])
            if len(lrs) >= args.max_train_steps:
                break
        if len(lrs) >= args.max_train_steps:
            break

    with open(os.path.join(os.environ["PROOF_OUT"], f"rank{accelerator.process_index}.json"), "w") as out:
        json.dump({"num_processes": accelerator.num_processes, "lrs": lrs}, out)


if __name__ == "__main__":
    main()
