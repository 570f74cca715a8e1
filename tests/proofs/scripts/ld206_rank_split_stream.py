"""A raw DDP job over an IterableDataset that slices its rows by rank: each rank reads its own part."""

import gc
import itertools
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

ROWS = 16


class Rows(IterableDataset):
    def __init__(self, count):
        self.count = count

    def __iter__(self):
        worker = get_worker_info()
        ids = range(self.count) if worker is None else range(worker.id, self.count, worker.num_workers)
        for i in itertools.islice(ids, dist.get_rank(), None, dist.get_world_size()):
            yield torch.tensor([float(i)])


def main():
    dist.init_process_group("gloo")
    model = DistributedDataParallel(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    loader = DataLoader(Rows(ROWS), batch_size=4)
    seen = []
    for x in loader:
        seen.extend(int(v) for v in x.squeeze(1).tolist())
        model(x).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    with open(os.path.join(os.environ["PROOF_OUT"], f"rank{dist.get_rank()}.json"), "w") as out:
        json.dump({"seen": seen, "world": dist.get_world_size()}, out)
    del model
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
