"""Pitfall: `accelerator.save_state()` under a main-process guard (LD405).

With `automatic_checkpoint_naming=True`, `save_state` calls `wait_for_everyone()` (a barrier), so only
rank 0 entering it leaves rank 0 in a barrier while rank 1 trains on.

Variants:
  broken  - `if accelerator.is_main_process:` then `accelerator.save_state()` at step 3.
  fixed   - `accelerator.save_state()` on every rank at step 3.
"""

import argparse

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--variant", choices=["broken", "fixed"], default="broken")
parser.add_argument("--out", required=True)
parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
args = parser.parse_args()

torch.manual_seed(0)
config = ProjectConfiguration(project_dir=args.out, automatic_checkpoint_naming=True)
accelerator = Accelerator(cpu=args.device == "cpu", project_config=config)

dataset = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
loader = DataLoader(dataset, batch_size=4)
model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

for step, (x, y) in enumerate(loader):
    if step == 8:
        break
    loss = nn.functional.mse_loss(model(x), y)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    if step == 3:
        if args.variant == "broken":
            if accelerator.is_main_process:
                accelerator.save_state()
        else:
            accelerator.save_state()

accelerator.wait_for_everyone()
print(f"DONE rank={accelerator.process_index}")
