"""Fits a tiny regressor on every GPU the job is given; the launch line decides how many and where."""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

os.environ["MASTER_ADDR"] = "localhost"
os.environ["MASTER_PORT"] = "29533"


def fit(index=0):
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["RANK"]))
    model = DistributedDataParallel(torch.nn.Linear(16, 1).cuda())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(100):
        loss = model(torch.randn(8, 16).cuda()).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    torch.save(model.state_dict(), "regressor.pt")


if __name__ == "__main__":
    fit()
