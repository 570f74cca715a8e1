"""Pitfall: a mean token loss under gradient accumulation and data parallelism (LD102).

Sequences of 2..16 tokens padded with -100, so micro-batches hold very different token counts; the
per-micro-batch mean then weights tokens unequally, and the step is not the global token mean.

Variants:
  broken             - mean `F.cross_entropy(..., ignore_index=-100)` inside `accelerator.accumulate`.
  token_window       - `microbatch_groups` + `TokenLossWindow`; sum-reduced loss through `window.scale_sum`.
  token_window_mean  - the same recipe with the mean loss through `window.scale_mean(loss, batch)`.
  fixed_length       - every sequence 16 tokens, no -100: the mean is already exact.
"""

import argparse

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader

VARIANTS = ["broken", "token_window", "token_window_mean", "fixed_length"]
parser = argparse.ArgumentParser()
parser.add_argument("--variant", choices=VARIANTS, default="broken")
args = parser.parse_args()

V, T = 11, 16
torch.manual_seed(0)
accelerator = Accelerator(cpu=True, gradient_accumulation_steps=4)
samples = []
for _ in range(32):
    length = T if args.variant == "fixed_length" else int(torch.randint(2, T + 1, ()))
    ids = torch.randint(1, V, (T,))
    labels = torch.roll(ids, -1)
    if length < T:
        ids[length:] = 0
        labels[length - 1 :] = -100
    samples.append({"input_ids": ids, "labels": labels})
loader = DataLoader(samples, batch_size=2)
model = nn.Sequential(nn.Embedding(V, 8), nn.Linear(8, V))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

if args.variant in ("broken", "fixed_length"):
    for batch in loader:
        with accelerator.accumulate(model):
            logits = model(batch["input_ids"])
            loss = F.cross_entropy(logits.view(-1, V), batch["labels"].view(-1), ignore_index=-100)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
else:
    from lintdist.runtime import TokenLossWindow, microbatch_groups

    for micro_batches in microbatch_groups(loader, accelerator.gradient_accumulation_steps):
        window = TokenLossWindow(micro_batches, accelerator=accelerator, model=model)
        for i, batch in enumerate(micro_batches):
            with window.sync(i):
                logits = model(batch["input_ids"])
                flat_logits, flat_labels = logits.view(-1, V), batch["labels"].view(-1)
                if args.variant == "token_window":
                    loss_sum = F.cross_entropy(flat_logits, flat_labels, ignore_index=-100, reduction="sum")
                    loss = window.scale_sum(loss_sum)
                else:
                    loss_mean = F.cross_entropy(flat_logits, flat_labels, ignore_index=-100)
                    loss = window.scale_mean(loss_mean, batch)
                accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()

accelerator.wait_for_everyone()
print(f"DONE rank={accelerator.process_index}")
