"""A raw DDP training script whose loader has no DistributedSampler: every rank reads the whole dataset."""

import gc
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)  # rank-dependent shuffles: the ranks' orders differ, their contents do not
    features = torch.arange(32, dtype=torch.float32).unsqueeze(1)
    dataset = TensorDataset(features, features * 3.0)
    loader = DataLoader(dataset, batch_size=4, shuffle=True)
    model = DistributedDataParallel(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)

    orders = []
    for epoch in range(3):
        seen = []
        for x, y in loader:
            seen.extend(int(v) for v in x.squeeze(1).tolist())
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        orders.append(seen)

    with open(os.path.join(os.environ["PROOF_OUT"], f"rank{rank}.json"), "w") as out:
        json.dump({"orders": orders, "world": dist.get_world_size()}, out)
    del model
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
