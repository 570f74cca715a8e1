"""Raw-torch evaluation on 2 gloo ranks over an 11-sample set: DistributedSampler pads it to 12."""

import json
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

SAMPLES = 11


def interleaved_cut(gathered, count):
    """The ranks' results in the padded order (rank r holds positions r, r + W, ...), cut to the dataset."""
    return torch.stack(gathered, dim=1).flatten()[:count]


def main():
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    features = torch.arange(SAMPLES, dtype=torch.float64)
    labels = (features % 3 == 0).long()  # the model below is right on every sample except multiples of 3
    val_set = TensorDataset(features, labels)
    loader = DataLoader(val_set, batch_size=4, sampler=DistributedSampler(val_set, shuffle=False))

    def model(x):  # predicts class 0 everywhere
        return torch.zeros_like(x, dtype=torch.long)

    correct = torch.zeros(1, dtype=torch.float64)
    total = torch.zeros(1, dtype=torch.float64)
    hits = []
    with torch.no_grad():
        for x, y in loader:
            hit = model(x) == y
            correct += hit.sum()
            total += y.numel()
            hits.append(hit)
    dist.all_reduce(correct)
    dist.all_reduce(total)
    gathered = [None] * world
    dist.all_gather_object(gathered, torch.cat(hits))

    reference = (model(features) == labels).double().mean().item()  # one process, every sample once
    report = {
        "world": world,
        "reference": reference,
        "reduced": (correct / total).item(),
        "reduced_total": total.item(),
        "gathered": torch.cat(gathered).double().mean().item(),
        "gathered_count": sum(len(g) for g in gathered),
        "cut": interleaved_cut(gathered, SAMPLES).double().mean().item(),
    }
    with open(os.path.join(os.environ["PROOF_OUT"], f"rank{dist.get_rank()}.json"), "w") as out:
        json.dump(report, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
