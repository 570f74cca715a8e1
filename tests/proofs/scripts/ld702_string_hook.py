"""Ask accelerate for PowerSGD with the hook's name as a string, then report the hook DDP really runs."""

import tempfile

import torch
import torch.distributed as dist
from accelerate import Accelerator
from accelerate.utils import DistributedDataParallelKwargs

handler = DistributedDataParallelKwargs(comm_hook="power_sgd", comm_state_option={"matrix_approximation_rank": 1})
accelerator = Accelerator(cpu=True, kwargs_handlers=[handler])

with tempfile.NamedTemporaryFile() as store:
    dist.init_process_group("gloo", init_method=f"file://{store.name}", rank=0, world_size=1)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    accelerator.ddp_handler.register_comm_hook(model)  # what `prepare` does once it has wrapped the model
    print("hook:", model._get_ddp_logging_data().get("comm_hook"))
    dist.destroy_process_group()
