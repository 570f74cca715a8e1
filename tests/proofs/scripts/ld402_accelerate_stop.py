"""An accelerate training loop that stops early on a value each rank measures for itself.

Rank r's monitored validation loss is (1 + r) / (step + 1): it falls under the target at step 5 on rank 0 and
at step 10 on rank 1. Every step runs a DDP backward (an all-reduce of the gradients). Each rank writes the step
it stopped at to $PROOF_OUT/rank<R>.json before the closing barrier. The process group times out after a few
seconds, so a rank left waiting fails fast instead of hanging for 30 minutes.
"""

import json
import os
from datetime import timedelta
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs

OUT = Path(os.environ["PROOF_OUT"])
TARGET = 0.2

accelerator = Accelerator(
    cpu=True, kwargs_handlers=[InitProcessGroupKwargs(backend="gloo", timeout=timedelta(seconds=6))]
)
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
model, optimizer = accelerator.prepare(model, optimizer)

stopped_at = None
for step in range(30):
    inputs = torch.randn(8, 4)
    loss = model(inputs).pow(2).mean()
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    val_loss = (1 + accelerator.process_index) / (step + 1)
    stopped_at = step
    if val_loss < TARGET:
        break

(OUT / f"rank{accelerator.process_index}.json").write_text(json.dumps({"stopped_at": stopped_at}))
accelerator.wait_for_everyone()
accelerator.end_training()
