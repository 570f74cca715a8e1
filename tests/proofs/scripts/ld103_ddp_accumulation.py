"""Raw DDP gradient accumulation (3 micro-batches per step) without no_sync, with a comm hook that counts all-reduces.

Beside the training it replays every rank's micro-batches on a single-process float64 copy of the model: the
gradient DDP should hold at each optimizer step is the mean over all micro-batches of the window (DDP averages
over ranks, the loss is divided by the accumulation steps).
"""

import json
import os

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

ACCUM = 3
MICRO_BATCHES = 9  # per rank: three full windows
BATCH = 4
LR = 0.1


def counting_allreduce(state, bucket):
    state["all_reduces"] += 1
    return allreduce_hook(None, bucket)


def loss_fn(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def flat_grad(module):
    return torch.cat([p.grad.detach().flatten() for p in module.parameters()]).tolist()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(world, MICRO_BATCHES, BATCH, 5, generator=generator, dtype=torch.float64)
    targets = torch.randn(world, MICRO_BATCHES, BATCH, 2, generator=generator, dtype=torch.float64)

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).double()
    reference = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).double()
    reference.load_state_dict(net.state_dict())
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=LR)

    model = DDP(net)
    counter = {"all_reduces": 0}
    model.register_comm_hook(counter, counting_allreduce)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)

    per_micro_batch, step_grads, reference_grads = [], [], []
    batches = list(zip(features[rank], targets[rank]))
    for step, (x, y) in enumerate(batches):
        before = counter["all_reduces"]
        loss = loss_fn(model, x, y) / ACCUM
        loss.backward()
        per_micro_batch.append(counter["all_reduces"] - before)
        if (step + 1) % ACCUM == 0:
            step_grads.append(flat_grad(model.module))
            optimizer.step()
            optimizer.zero_grad()

            # the reference: one process, every rank's micro-batches of this window, mean of their losses
            window = range(step + 1 - ACCUM, step + 1)
            total = sum(loss_fn(reference, features[r, g], targets[r, g]) for r in range(world) for g in window)
            (total / (world * ACCUM)).backward()
            reference_grads.append(flat_grad(reference))
            reference_optimizer.step()
            reference_optimizer.zero_grad()

    report = {
        "world": world,
        "per_micro_batch": per_micro_batch,
        "step_grads": step_grads,
        "reference_grads": reference_grads,
    }
    with open(os.path.join(os.environ["PROOF_OUT"], f"rank{rank}.json"), "w") as out:
        json.dump(report, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
