"""A raw torch.distributed script in which rank 0 writes a checkpoint (slowly) and every rank then loads it.

Each rank reports what it loaded, or the error its load raised, to `$PROOF_OUT/rank<R>.json`.
"""

import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

OUT = Path(os.environ["PROOF_OUT"])


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    checkpoint = OUT / "averaged.pt"
    torch.manual_seed(0)
    weights = torch.randn(4, 3)
    if rank == 0:
        time.sleep(2.0)  # a large model on a slow filesystem: the write takes a while
        torch.save({"weights": weights}, checkpoint)
    try:
        loaded = torch.load(checkpoint)["weights"].flatten().tolist()
        error = None
    except (FileNotFoundError, EOFError, RuntimeError) as exc:
        loaded, error = None, type(exc).__name__
    report = {"loaded": loaded, "error": error, "expected": weights.flatten().tolist()}
    (OUT / f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
