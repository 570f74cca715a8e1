"""A script meant for torchrun and for one process: a DistributedSampler only when there are several ranks."""

import gc
import json
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    torch.manual_seed(0)
    features = torch.arange(32, dtype=torch.float32).unsqueeze(1)
    dataset = TensorDataset(features, features * 2.0)
    sampler = DistributedSampler(dataset, seed=5) if distributed else None

    report = {"world": dist.get_world_size() if distributed else 1}
    try:
        loader = DataLoader(dataset, batch_size=4, shuffle=True, sampler=sampler)
    except ValueError as error:
        report["error"] = str(error)
    else:
        model = torch.nn.Linear(1, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
        orders = []
        for epoch in range(2):
            if sampler is not None:
                sampler.set_epoch(epoch)
            seen = []
            for x, y in loader:
                seen.extend(int(v) for v in x.squeeze(1).tolist())
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()
            orders.append(seen)
        report["orders"] = orders

    with open(os.path.join(os.environ["PROOF_OUT"], f"rank{rank}.json"), "w") as out:
        json.dump(report, out)
    gc.collect()
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
