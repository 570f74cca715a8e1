"""FSDP2 through accelerate with the model and its optimizer prepared in separate calls, a teacher model
prepared alone, and `prepare_model`: each call raises ValueError under FSDP2 (FSDP runs on CPU ranks here
through `ld306_fsdp_on_cpu`, see its docstring)."""

import os

import ld306_fsdp_on_cpu as proof
import torch
from accelerate import Accelerator, FullyShardedDataParallelPlugin

SCRIPT = os.path.basename(__file__)


def main():
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Block"]
    )
    accelerator = Accelerator(fsdp_plugin=plugin)
    model = proof.Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    teacher = proof.Net().eval()  # inference only
    failures = []
    try:
        model = accelerator.prepare(model)
    except ValueError as error:
        failures.append(proof.failure(error, SCRIPT))
    try:
        optimizer = accelerator.prepare(optimizer)
    except ValueError as error:
        failures.append(proof.failure(error, SCRIPT))
    try:
        teacher = accelerator.prepare(teacher)
    except ValueError as error:
        failures.append(proof.failure(error, SCRIPT))
    try:
        model = accelerator.prepare_model(model)
    except ValueError as error:
        failures.append(proof.failure(error, SCRIPT))
    proof.write({"failures": failures})


if __name__ == "__main__":
    main()
