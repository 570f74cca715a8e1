"""Weights saved from the model `accelerator.prepare` returned (DDP on 2 gloo ranks, MULTI_CPU).

The checkpoint lands in `$PROOF_OUT/model.pt`; each rank writes the plain model's weights (the reference a
loader would expect) to ``$PROOF_OUT/rank<R>.json``.
"""

import json
import os

import torch
from accelerate import Accelerator


def main():
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    for _ in range(2):
        accelerator.backward(model(torch.randn(8, 4)).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()
    out = os.environ["PROOF_OUT"]
    accelerator.save(model.state_dict(), os.path.join(out, "model.pt"))
    accelerator.wait_for_everyone()
    plain = {name: p.detach().tolist() for name, p in accelerator.unwrap_model(model).named_parameters()}
    with open(os.path.join(out, f"rank{accelerator.process_index}.json"), "w") as f:
        json.dump({"type": type(model).__name__, "weights": plain}, f)
    accelerator.end_training()  # destroys the process group: no gloo thread left at interpreter exit


if __name__ == "__main__":
    main()
