"""Coordinate ranks: main process first (exception-safe), any-rank flags, the sequence-parallel group."""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from lintdist.runtime._dist import all_reduce, barrier, is_distributed


@contextmanager
def main_process_first(*, accelerator: Any = None, local: bool = False) -> Iterator[None]:
    """Run the block on the main process (per node with `local=True`) first, then on the others.

    The block runs on every rank, only ordered. It is exception-safe: if it raises on the main
    process, the others are still released, and the exception propagates. With an accelerator
    the ordering is accelerate's `main_process_first`/`local_main_process_first`, made
    exception-safe. Without a process group it just runs the block. The block must not contain
    collectives.

    Example::

        with main_process_first():
            dataset = load_dataset("imdb").map(tokenize)
    """
    if accelerator is not None:
        first = accelerator.is_local_main_process if local else accelerator.is_main_process
        ordered = accelerator.local_main_process_first() if local else accelerator.main_process_first()
        try:
            with ordered:
                yield
        except BaseException:
            # accelerate's _goes_first skips its closing barrier when the block raises.
            if first:
                accelerator.wait_for_everyone()
            raise
        return
    if not is_distributed():
        yield
        return
    # LOCAL_RANK is set by torchrun and accelerate; without it, rank 0 alone goes first.
    rank = int(os.environ.get("LOCAL_RANK", dist.get_rank())) if local else dist.get_rank()
    if rank != 0:
        barrier()
    try:
        yield
    finally:
        if rank == 0:
            barrier()


def any_rank(flag: bool | torch.Tensor, *, accelerator: Any = None, group: dist.ProcessGroup | None = None) -> bool:
    """True on every rank when `flag` is true on at least one rank (an all-reduce MAX).

    Every rank must call it at the same point. For early stopping in raw DDP; accelerate code can
    use `set_trigger`/`check_trigger`.

    Example::

        if any_rank(val_loss > best_loss + tolerance):
            break
    """
    local = torch.as_tensor(flag).bool().any().to(torch.int32)
    if group is None and accelerator is not None:
        return bool(accelerator.reduce(local.to(accelerator.device), reduction="max").item())
    return bool(all_reduce(local, dist.ReduceOp.MAX, group).item())


def sequence_parallel_group(accelerator: Any) -> dist.ProcessGroup:
    """The sequence-parallel process group, found the way transformers does.

    DeepSpeed's `deepspeed.utils.groups._get_sequence_parallel_group()` when DeepSpeed is
    importable and its SP group exists (under DeepSpeed Ulysses `accelerator.torch_device_mesh`
    is None), else `accelerator.torch_device_mesh["sp"].get_group()`. Raises ValueError when
    neither exists.

    Example::

        losses = torch.distributed.nn.functional.all_gather(loss, group=sequence_parallel_group(accelerator))
    """
    group = _deepspeed_sequence_parallel_group()
    if group is not None:
        return group
    mesh = getattr(accelerator, "torch_device_mesh", None)
    if mesh is not None and "sp" in (mesh.mesh_dim_names or ()):
        return mesh["sp"].get_group()
    raise ValueError(
        "no sequence-parallel group: DeepSpeed has none and accelerator.torch_device_mesh has no 'sp' dimension"
    )


def _deepspeed_sequence_parallel_group() -> dist.ProcessGroup | None:
    if not is_distributed():
        return None
    try:
        groups = importlib.import_module("deepspeed.utils.groups")
    except ImportError:
        return None
    try:
        return groups._get_sequence_parallel_group()
    except (KeyError, AssertionError):
        # deepspeed raises KeyError("No sequence parallel group found") before SP is set up.
        return None
