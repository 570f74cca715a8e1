"""A raw-DDP training script of about 100 lines with two findings that have fixes (LD201 and LD704): the start-up
benchmark's second script (benchmarks/bench.py --startup), where the reporter and the fix machinery load too."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class NoisySquares(Dataset):
    """Pairs (x, x**2 + noise) drawn once, so every rank sees the same data set."""

    def __init__(self, count: int, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        self.inputs = torch.rand(count, 1, generator=generator) * 4 - 2
        self.targets = self.inputs.pow(2) + 0.05 * torch.randn(count, 1, generator=generator)

    def __len__(self):
        return len(self.inputs)

    def __getitem__(self, index):
        return self.inputs[index], self.targets[index]


class Regressor(nn.Module):
    def __init__(self, width: int = 64):
        super().__init__()
        self.hidden = nn.Sequential(nn.Linear(1, width), nn.GELU(), nn.Linear(width, width), nn.GELU())
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        return self.head(self.hidden(x))


def parse_args():
    parser = argparse.ArgumentParser(description="fit a parabola on every GPU")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--samples", type=int, default=65536)
    parser.add_argument("--out", default="regressor.pt")
    return parser.parse_args()


def setup():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    return local_rank


def evaluate(model, loader, device):
    model.eval()
    total, count = torch.zeros((), device=device), torch.zeros((), device=device)
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            total += F.mse_loss(model(x), y, reduction="sum")
            count += y.numel()
    dist.all_reduce(total)
    dist.all_reduce(count)
    model.train()
    return (total / count).item()


def main():
    args = parse_args()
    local_rank = setup()
    device = torch.device("cuda", local_rank)
    dataset = NoisySquares(args.samples)
    sampler = DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=2, pin_memory=True)
    model = DDP(Regressor().to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scaler = torch.cuda.amp.GradScaler()

    for epoch in range(args.epochs):
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.float16):
                loss = F.mse_loss(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        error = evaluate(model, loader, device)
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: mse {error:.4f}")

    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
