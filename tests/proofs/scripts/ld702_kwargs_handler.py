"""Ask accelerate for DDP's fp16 gradient compression through a `KwargsHandler` keyword, then report the hook
that DDP really runs (one gloo rank, so it finishes in a second)."""

import tempfile

import torch
import torch.distributed as dist
from accelerate import Accelerator
from accelerate.utils import KwargsHandler
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

handler = KwargsHandler(ddp_communication_hook=default_hooks.fp16_compress_hook)
accelerator = Accelerator(cpu=True, kwargs_handlers=[handler])

with tempfile.NamedTemporaryFile() as store:
    dist.init_process_group("gloo", init_method=f"file://{store.name}", rank=0, world_size=1)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    accelerator.ddp_handler.register_comm_hook(model)  # what `prepare` does once it has wrapped the model
    print("hook:", model._get_ddp_logging_data().get("comm_hook"))
    dist.destroy_process_group()
