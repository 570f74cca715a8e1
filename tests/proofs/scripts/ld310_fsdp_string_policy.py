"""What FSDP1 does with the `mixed_precision` that Lightning's `FSDPStrategy` hands it, on 1 gloo CPU rank.

Lightning 2.6's `FSDPStrategy._setup_model` (and Fabric's `setup_module`) call
`FullyShardedDataParallel(module=model, mixed_precision=self.mixed_precision_config, ...)`, where
`mixed_precision_config` is the strategy's `mixed_precision` keyword whenever it is truthy, else the precision
plugin's policy: for `precision="bf16-mixed"`, `FSDPPrecision.mixed_precision_config` builds
`MixedPrecision(param_dtype=bfloat16, reduce_dtype=bfloat16, buffer_dtype=bfloat16)`. Lightning is not
installed here, so this script calls FSDP1 with the three values the strategy can pass:

* the string `"bf16"` (`FSDPStrategy(mixed_precision="bf16")`, before the fix),
* None (`FSDPStrategy()` with the default `precision="32-true"` plugin giving fp32 everywhere is the same),
* the policy `FSDPPrecision("bf16-mixed")` builds (after the fix, which passes `precision="bf16-mixed"`).

FSDP1 refuses a CPU module unless given `device_id=torch.device("cpu")` (`_init_device_handle`), so it is given.
Writes {case: "wrapped <output dtype>" or "raised <type>: <message>"} to `$PROOF_OUT/rank0.json`.
"""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision

LIGHTNING_BF16_MIXED = MixedPrecision(
    param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16, buffer_dtype=torch.bfloat16
)


def wrap(policy) -> str:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    try:
        sharded = FullyShardedDataParallel(model, mixed_precision=policy, device_id=torch.device("cpu"))
    except Exception as error:  # noqa: BLE001 - the outcome is the measurement
        return f"raised {type(error).__name__}: {error}"
    output = sharded(torch.randn(2, 8))
    output.float().sum().backward()
    return f"wrapped {str(output.dtype).removeprefix('torch.')}"


def main() -> None:
    dist.init_process_group("gloo")
    outcomes = {"string": wrap("bf16"), "none": wrap(None), "bf16_mixed_policy": wrap(LIGHTNING_BF16_MIXED)}
    with open(os.path.join(os.environ["PROOF_OUT"], f"rank{dist.get_rank()}.json"), "w") as out:
        json.dump(outcomes, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
