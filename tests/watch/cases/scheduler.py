"""Pitfall: a scheduler length taken from the prepared loader while accelerate steps it W times (LD503).

`len(train_loader)` is already per rank, and the prepared scheduler steps `num_processes` times per
optimizer step, so a schedule of `len(train_loader) * EPOCHS` steps reaches its end after 1/W of training.

Variants (`--schedule torch|transformers` picks LinearLR or get_linear_schedule_with_warmup):
  broken                  - num_training_steps = len(train_loader) * EPOCHS.
  helper                  - num_training_steps = scheduler_total_steps(len(train_loader) * EPOCHS, accelerator).
  split_batches           - DataLoaderConfiguration(split_batches=True): one scheduler step per optimizer step.
  no_step_with_optimizer  - Accelerator(step_scheduler_with_optimizer=False): one step per call.
"""

import argparse

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration
from torch import nn
from torch.optim.lr_scheduler import LinearLR
from torch.utils.data import DataLoader, TensorDataset

VARIANTS = ["broken", "helper", "split_batches", "no_step_with_optimizer"]
parser = argparse.ArgumentParser()
parser.add_argument("--variant", choices=VARIANTS, default="broken")
parser.add_argument("--schedule", choices=["torch", "transformers"], default="torch")
args = parser.parse_args()

EPOCHS = 3
torch.manual_seed(0)
if args.variant == "split_batches":
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(split_batches=True))
elif args.variant == "no_step_with_optimizer":
    accelerator = Accelerator(cpu=True, step_scheduler_with_optimizer=False)
else:
    accelerator = Accelerator(cpu=True)
dataset = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
train_loader = accelerator.prepare(DataLoader(dataset, batch_size=4, shuffle=True))
model, optimizer = accelerator.prepare(model, optimizer)

if args.variant == "helper":
    from lintdist.runtime import scheduler_total_steps

    num_training_steps = scheduler_total_steps(len(train_loader) * EPOCHS, accelerator)
else:
    num_training_steps = len(train_loader) * EPOCHS
if args.schedule == "torch":
    scheduler = LinearLR(optimizer, start_factor=1.0, end_factor=0.0, total_iters=num_training_steps)
else:
    from transformers import get_linear_schedule_with_warmup

    scheduler = get_linear_schedule_with_warmup(optimizer, 0, num_training_steps)
scheduler = accelerator.prepare(scheduler)

for epoch in range(EPOCHS):
    for x, y in train_loader:
        loss = nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()

accelerator.wait_for_everyone()
print(f"DONE rank={accelerator.process_index}")
