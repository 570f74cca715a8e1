"""LD309 proof, FSDP2 through accelerate on CPU ranks (see `ld306_fsdp_on_cpu`): raises TypeError at prepare: activation checkpointing with no wrap policy."""

import os

import ld306_fsdp_on_cpu as proof
import torch
from accelerate import Accelerator, FullyShardedDataParallelPlugin

SCRIPT = os.path.basename(__file__)


def main():
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, activation_checkpointing=True)
    accelerator = Accelerator(fsdp_plugin=plugin)
    model = proof.Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    try:
        model, optimizer = accelerator.prepare(model, optimizer)
    except TypeError as error:
        proof.write({"failure": proof.failure(error, SCRIPT)})
        return
    proof.write({"losses": proof.train_steps(accelerator, model, optimizer), **proof.layout(model)})


if __name__ == "__main__":
    main()
