"""Every gloo rank loads one checkpoint whose tensors carry the `cuda:0` location tag (as rank 0 of a GPU job
writes it): with no map_location torch restores them to cuda:0 on every rank, whatever the rank; map_location wins."""

import json
import os

import torch
import torch.distributed as dist
from torch import serialization


def write_cuda_tagged_checkpoint(path):
    """torch.save of CPU tensors, recorded as if they lived on cuda:0 (this machine has no GPU)."""
    real_tag = serialization.location_tag
    serialization.location_tag = lambda storage: "cuda:0"
    try:
        torch.save({"model": {"weight": torch.ones(4)}}, path)
    finally:
        serialization.location_tag = real_tag


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    path = os.path.join(os.environ["PROOF_OUT"], "checkpoint.pt")
    if rank == 0:
        write_cuda_tagged_checkpoint(path)
    dist.barrier()

    tags = []

    def record(storage, location):
        tags.append(location)
        return storage  # keep it on the CPU, where this test can look at it

    torch.load(path, map_location=record)
    try:
        torch.load(path)  # what every rank of a GPU job runs
        default = "loaded"
    except RuntimeError as error:
        default = str(error)
    mapped = torch.load(path, map_location="cpu")["model"]["weight"].device.type

    with open(os.path.join(os.environ["PROOF_OUT"], f"rank{rank}.json"), "w") as out:
        json.dump({"tags": tags, "default": default, "mapped": mapped}, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
