"""Report how many processes the Accelerator sees: one under plain `python`, the config's count under
`accelerate launch` (CPU processes, gloo)."""

import json
import os

from accelerate import Accelerator

accelerator = Accelerator(cpu=True)
report = {"num_processes": accelerator.num_processes, "distributed_type": str(accelerator.distributed_type)}
with open(os.path.join(os.environ["PROOF_OUT"], f"rank{accelerator.process_index}.json"), "w") as f:
    json.dump(report, f)
