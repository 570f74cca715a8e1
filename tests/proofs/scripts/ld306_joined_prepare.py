"""The same FSDP2 setup as `ld306_split_prepare.py`, written as accelerate needs it: the model and its
optimizer in one `prepare` call, the inference-only teacher kept out of `prepare`. It shards and trains."""

import ld306_fsdp_on_cpu as proof
import torch
from accelerate import Accelerator, FullyShardedDataParallelPlugin


def main():
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Block"]
    )
    accelerator = Accelerator(fsdp_plugin=plugin)
    model = proof.Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    teacher = proof.Net().eval().to(accelerator.device)  # inference only: not prepared
    model, optimizer = accelerator.prepare(model, optimizer)
    losses = proof.train_steps(accelerator, model, optimizer)
    with torch.no_grad():
        teacher_out = teacher(torch.ones(2, 16)).shape[0]
    proof.write({"losses": losses, "teacher_rows": teacher_out, **proof.layout(model)})


if __name__ == "__main__":
    main()
