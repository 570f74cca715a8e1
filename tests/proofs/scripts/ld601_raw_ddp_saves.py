"""A raw DDP script that writes its optimizer state with `torch.save` on every rank.

Run on 2 gloo ranks. The write goes through a sink that counts what this process serialized; each rank
reports to ``$PROOF_OUT/rank<R>.json`` whether it executed the write.
"""

import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


class CountingSink:
    def __init__(self, path):
        self.path = path
        self.written = 0
        self._file = None

    def write(self, data):
        if self._file is None:
            self._file = open(self.path, "wb")  # noqa: SIM115
        self.written += len(data)
        return self._file.write(data)

    def flush(self):
        if self._file is not None:
            self._file.flush()


def main():
    dist.init_process_group("gloo")
    model = DistributedDataParallel(torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(8, 4)).sum().backward()
    opt.step()
    out = os.environ["PROOF_OUT"]
    sink = CountingSink(os.path.join(out, "opt.pt"))
    torch.save(opt.state_dict(), sink)
    sink.flush()
    dist.barrier()
    me = dist.get_rank()
    with open(os.path.join(out, f"rank{me}.json"), "w") as f:
        json.dump({"rank": me, "wrote": sink.written > 0}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
