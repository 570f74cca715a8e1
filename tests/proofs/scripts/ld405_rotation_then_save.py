"""An accelerate training loop that checkpoints every step and keeps at most one checkpoint folder.

The main process deletes the oldest `checkpoint-<step>` folders and then calls `save_state`, all under one
main-process guard (LD405 reports the guard; its fix moves `save_state` out of it). Under DDP `save_state` creates
the folder and writes `random_states_<rank>.pkl` on every rank. Rank 0's rotation is slow here, as a listing on a
network filesystem can be: it waits up to ROTATION_DELAY_S before it lists the folders, and stops waiting as soon
as rank 1's part of this step's checkpoint is on disk (the race is decided then, so the run stays short). Each
rank writes what the last checkpoint folder holds to $PROOF_OUT/rank<R>.json.
"""

import json
import os
import shutil
import time
from datetime import timedelta
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs

OUT = Path(os.environ["PROOF_OUT"])
STEPS = 2
CHECKPOINTS_TOTAL_LIMIT = 1
# rank 1 leaves its part of a checkpoint within a fraction of a second; 3x that, on a loaded 2-core machine
ROTATION_DELAY_S = 1.5


def slow_filesystem(root, step):
    """Rank 0's delay before it lists ``root``: until rank 1's RNG file of this step exists, at most
    ROTATION_DELAY_S."""
    other_part = os.path.join(root, f"checkpoint-{step}", "random_states_1.pkl")
    deadline = time.monotonic() + ROTATION_DELAY_S
    while time.monotonic() < deadline and not os.path.exists(other_part):
        time.sleep(0.02)


def main():
    accelerator = Accelerator(
        cpu=True, kwargs_handlers=[InitProcessGroupKwargs(backend="gloo", timeout=timedelta(seconds=20))]
    )
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    root = str(OUT / "checkpoints")
    os.makedirs(root, exist_ok=True)

    for step in range(1, STEPS + 1):
        accelerator.backward(model(torch.randn(8, 4)).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()
        if accelerator.is_main_process:
            # keep at most CHECKPOINTS_TOTAL_LIMIT folders, counting the one about to be written
            if CHECKPOINTS_TOTAL_LIMIT is not None:
                slow_filesystem(root, step)
                kept = sorted((d for d in os.listdir(root) if d.startswith("checkpoint-")), key=lambda d: int(d[11:]))
                for old in kept[: max(len(kept) - CHECKPOINTS_TOTAL_LIMIT + 1, 0)]:
                    shutil.rmtree(os.path.join(root, old))
            save_path = os.path.join(root, f"checkpoint-{step}")
            accelerator.save_state(save_path)
            print(f"saved {save_path}")

    accelerator.wait_for_everyone()
    last = Path(root) / f"checkpoint-{STEPS}"
    report = {
        "folders": sorted(os.listdir(root)),
        "last": sorted(os.listdir(last)) if last.is_dir() else None,
    }
    (OUT / f"rank{accelerator.process_index}.json").write_text(json.dumps(report))
    accelerator.end_training()


if __name__ == "__main__":
    main()
