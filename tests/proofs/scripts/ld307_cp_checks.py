"""What accelerate 1.15 does with `ParallelismConfig(cp_size=2)` and no FSDP2 plugin, on 2 gloo CPU ranks.

accelerate never takes its multi-device path on a CPU: `PartialState._prepare_backend` gives `MULTI_CPU`
(`cpu=True`) or `NO`, and the context-parallel check of `AcceleratorState.__init__` sits in the branch for
`MULTI_GPU`, `MULTI_XPU`, ... only. So this script runs each case twice over:

* "cpu": the real CPU run, untouched. accelerate rejects `cp_size > 1` there for every plugin, FSDP2
  included, with another error (`ParallelismConfig._validate_accelerator`: "only compatible ... but got
  MULTI_CPU"), because FSDP is never switched on for the CPU: the CPU cannot tell the cases apart.
* "multi_gpu": the distributed type `PartialState` would have chosen on a GPU node is written into its shared
  state (`MULTI_GPU`, on the same gloo process group and CPU device) before the `Accelerator` is built. From
  there on everything is accelerate's own code, unpatched: `Accelerator.__init__` and the real
  `AcceleratorState.__init__` branch with its checks, `get_device_mesh` and `_validate_accelerator`.

Each rank writes {case: "built <distributed type> fsdp2=<bool>" or "raised <type>: <message>"} to
`$PROOF_OUT/rank<R>.json`.
"""

from __future__ import annotations

import json
import os

from accelerate import Accelerator, FullyShardedDataParallelPlugin
from accelerate.parallelism_config import ParallelismConfig
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import DistributedType

PLUGINS = {
    "none": lambda: None,
    "fsdp1": lambda: FullyShardedDataParallelPlugin(fsdp_version=1),
    "fsdp2": lambda: FullyShardedDataParallelPlugin(fsdp_version=2),
}


def attempt(*, cpu: bool, plugin: str, cp_size: int, standalone: bool = False) -> str:
    AcceleratorState._reset_state(reset_partial_state=False)
    os.environ.pop("ACCELERATE_USE_FSDP", None)  # an earlier case's plugin sets it
    os.environ.pop("ACCELERATE_ALLOW_CP_STANDALONE", None)
    if standalone:
        os.environ["ACCELERATE_ALLOW_CP_STANDALONE"] = "true"
    state = PartialState(cpu=True)
    state.distributed_type = DistributedType.MULTI_CPU if cpu else DistributedType.MULTI_GPU
    try:
        accelerator = Accelerator(
            cpu=cpu, parallelism_config=ParallelismConfig(cp_size=cp_size), fsdp_plugin=PLUGINS[plugin]()
        )
    except Exception as error:  # noqa: BLE001 - the outcome is the measurement
        return f"raised {type(error).__name__}: {str(error).strip()}"
    return f"built {accelerator.distributed_type.value} fsdp2={accelerator.is_fsdp2}"


def main() -> None:
    state = PartialState(cpu=True)
    assert state.num_processes == 2 and state.backend == "gloo", (state.num_processes, state.backend)
    outcomes = {"cpu_cp2_fsdp2": attempt(cpu=True, plugin="fsdp2", cp_size=2)}
    for plugin in PLUGINS:
        outcomes[f"multi_gpu_cp2_{plugin}"] = attempt(cpu=False, plugin=plugin, cp_size=2)
    outcomes["multi_gpu_cp1_fsdp1"] = attempt(cpu=False, plugin="fsdp1", cp_size=1)
    for plugin in ("none", "fsdp1"):  # accelerate's escape hatch skips the check: what happens next
        outcomes[f"multi_gpu_cp2_{plugin}_standalone"] = attempt(cpu=False, plugin=plugin, cp_size=2, standalone=True)
    with open(os.path.join(os.environ["PROOF_OUT"], f"rank{state.process_index}.json"), "w") as out:
        json.dump(outcomes, out)
    state.wait_for_everyone()


if __name__ == "__main__":
    main()
