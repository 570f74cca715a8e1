"""A checkpoint written with `torch.save` after training, prepared with accelerate.

Run on 2 gloo ranks (MULTI_CPU). The checkpoint goes through a sink that counts the bytes this process
serialized into it, then lands in `$PROOF_OUT/ckpt.pt`. Each rank writes to ``$PROOF_OUT/rank<R>.json``
whether it executed the write.
"""

import json
import os

import torch
from accelerate import Accelerator


class CountingSink:
    """A file-like target for `torch.save`: forwards to a real file and counts what this process wrote."""

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
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    for _ in range(3):
        accelerator.backward(model(torch.randn(8, 4)).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()
    out = os.environ["PROOF_OUT"]
    sink = CountingSink(os.path.join(out, "ckpt.pt"))
    torch.save(accelerator.unwrap_model(model).state_dict(), sink)
    sink.flush()
    accelerator.wait_for_everyone()
    report = {"rank": accelerator.process_index, "wrote": sink.written > 0}
    with open(os.path.join(out, f"rank{accelerator.process_index}.json"), "w") as f:
        json.dump(report, f)
    accelerator.end_training()  # destroys the process group: no gloo thread left at interpreter exit


if __name__ == "__main__":
    main()
