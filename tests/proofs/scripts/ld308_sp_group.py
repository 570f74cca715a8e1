"""Ulysses sequence parallelism: the SP group fetched for a differentiable loss aggregation (LD308 proof script).

`sp_loss` is what a training loop calls after `accelerator.prepare`; the proof calls it with stand-ins for the
accelerator, because DeepSpeed (which `prepare` needs for sequence parallelism) is not installed here.
"""

import torch
import torch.distributed.nn.functional as dist_nn
from accelerate import Accelerator
from accelerate.utils import ParallelismConfig


def sp_group(accelerator):
    return accelerator.torch_device_mesh["sp"].get_group()


def sp_loss(accelerator, loss, good_tokens):
    group = sp_group(accelerator)
    losses = dist_nn.all_gather(loss, group=group)
    counts = dist_nn.all_gather(good_tokens, group=group)
    return sum(l * n for l, n in zip(losses, counts)) / max(sum(counts), 1)


def main():
    accelerator = Accelerator(parallelism_config=ParallelismConfig(sp_backend="deepspeed", sp_size=2))
    print(sp_loss(accelerator, torch.tensor(1.0), torch.tensor(3)))


if __name__ == "__main__":
    main()
