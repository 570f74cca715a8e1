"""Small torch.distributed helpers shared by the runtime modules: is a group up, reduce, barrier, world size."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def is_distributed() -> bool:
    """True when a default process group exists."""
    return dist.is_available() and dist.is_initialized()


def _collective_device(tensor: torch.Tensor, group: Any) -> torch.device:
    # NCCL (and XCCL) cannot reduce CPU tensors; gloo, MPI and mixed "cpu:gloo,cuda:nccl" backends can.
    capable: list[str] = []
    for part in str(dist.get_backend(group)).split(","):
        capable += dist.Backend.backend_capability.get(part.split(":")[-1], [tensor.device.type])
    if tensor.device.type in capable:
        return tensor.device
    for device_type in capable:
        module = getattr(torch, device_type, None)
        if module is not None and module.is_available():
            return torch.device(device_type, module.current_device())
    return tensor.device


def all_reduce(tensor: torch.Tensor, op: dist.ReduceOp.RedOpType, group: Any = None) -> torch.Tensor:
    """Reduce a copy of `tensor` over `group` (the world by default); a copy of it without a process group."""
    if not is_distributed():
        return tensor.detach().clone()
    work = tensor.detach().to(_collective_device(tensor, group), copy=True)
    dist.all_reduce(work, op=op, group=group)
    return work.to(tensor.device)


def barrier() -> None:
    """A barrier on the default group that names the current CUDA device for NCCL."""
    if dist.get_backend() == "nccl":
        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()


def data_parallel_world_size(accelerator: Any = None, group: Any = None) -> int:
    """W: the size of `group`, else `accelerator.num_processes`, else the world size, else 1."""
    if group is not None:
        return dist.get_world_size(group)
    if accelerator is not None:
        return int(accelerator.num_processes)
    return dist.get_world_size() if is_distributed() else 1
