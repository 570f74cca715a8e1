"""LD501 proof script: seeds every global generator by hand with a per-rank seed, draws from each, and writes
the draws to $PROOF_OUT/rank<R>.json. The fix replaces the seeds with set_seed(n, device_specific=True)."""

import json
import os
import random

import numpy as np
import torch
from accelerate import Accelerator

SEED = 1234


def main():
    accelerator = Accelerator(cpu=True)
    random.seed(SEED + accelerator.process_index)
    np.random.seed(SEED + accelerator.process_index)
    torch.manual_seed(SEED + accelerator.process_index)
    draws = {
        "random": [random.random() for _ in range(3)],
        "numpy": np.random.rand(3).tolist(),
        "torch": torch.rand(3).tolist(),
    }
    out = os.environ["PROOF_OUT"]
    with open(os.path.join(out, f"rank{accelerator.process_index}.json"), "w") as f:
        json.dump(draws, f)


if __name__ == "__main__":
    main()
