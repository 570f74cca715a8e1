"""Register torch's fp16 compression hook on a raw DDP model with the arguments in the wrong order."""

import tempfile

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

with tempfile.NamedTemporaryFile() as store:
    dist.init_process_group("gloo", init_method=f"file://{store.name}", rank=0, world_size=1)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    model.register_comm_hook(default_hooks.fp16_compress_hook, None)
    print("hook:", model._get_ddp_logging_data().get("comm_hook"))
    dist.destroy_process_group()
