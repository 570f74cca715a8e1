"""A torchrun script that picks its CUDA device from the global rank, read from RANK.

It runs on CPU (gloo): building a `torch.device` needs no GPU, so each process records the index it would hand to
`torch.cuda.set_device` and whether that index exists on a node with DEVICES_PER_NODE GPUs."""

import json
import os

import torch
import torch.distributed as dist

DEVICES_PER_NODE = 2  # the nodes the proof pretends to run on


def main():
    dist.init_process_group("gloo")
    device = torch.device("cuda", int(os.environ["RANK"]))
    # every process's (node, index), so that two processes of one node sharing a GPU would show
    pairs = [None] * dist.get_world_size()
    dist.all_gather_object(pairs, (int(os.environ["GROUP_RANK"]), device.index))
    report = {
        "rank": dist.get_rank(),
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "index": device.index,
        "valid": 0 <= device.index < DEVICES_PER_NODE,
        "pairs": pairs,
    }
    with open(os.path.join(os.environ["PROOF_OUT"], f"rank{dist.get_rank()}.json"), "w") as out:
        json.dump(report, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
