"""An accelerate evaluation pass over 11 samples on 2 ranks with batch size 3: the last batch is padded."""

import gc
import json
import os

import torch
import torch.distributed as dist
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

SAMPLES = 11


def reference_error(model, features, targets):
    """The single-process mean absolute error over the whole dataset, in float64."""
    with torch.no_grad():
        errors = (model(features).squeeze(-1) - targets).double().abs()
    return errors.sum().item() / SAMPLES


def main():
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    features = torch.arange(SAMPLES, dtype=torch.float32).unsqueeze(1)
    targets = features.squeeze(-1) * 3.0 + 1.0
    model = torch.nn.Linear(1, 1)
    expected = reference_error(model, features, targets)

    eval_loader = DataLoader(TensorDataset(features, targets, torch.arange(SAMPLES)), batch_size=3)
    model, eval_loader = accelerator.prepare(model, eval_loader)
    model.eval()
    gathered_errors, gathered_ids = [], []
    for x, y, ids in eval_loader:
        with torch.no_grad():
            predicted = model(x).squeeze(-1)
        gathered_errors.append(accelerator.gather(predicted - y))
        gathered_ids.append(accelerator.gather(ids))

    errors = torch.cat(gathered_errors).double().abs()
    ids = torch.cat(gathered_ids).tolist()
    with open(os.path.join(os.environ["PROOF_OUT"], f"rank{accelerator.process_index}.json"), "w") as out:
        json.dump(
            {
                "world": accelerator.num_processes,
                "count": len(ids),
                "ids": sorted(ids),
                "metric": errors.sum().item() / len(ids),
                "expected": expected,
            },
            out,
        )
    accelerator.wait_for_everyone()
    del model
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
