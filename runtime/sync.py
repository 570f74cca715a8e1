"""Skip gradient synchronisation on non-final micro-batches for DDP, FSDP1, FSDP2 and accelerate-prepared models."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch


@contextmanager
def grad_sync(model: torch.nn.Module, sync: bool, *, accelerator: Any = None) -> Iterator[None]:
    """Run the forward and backward inside this block with gradient synchronisation on (`sync`) or off.

    Without an accelerator: FSDP2 modules get `set_requires_gradient_sync(False)` (restored to True
    on exit), DDP and FSDP1 use `no_sync()`, anything else is left alone. With an accelerator:
    `accelerator.sync_gradients` is set to `sync` (it gates `AcceleratedOptimizer.step`, the
    scheduler and the DeepSpeed accumulation boundary) and the block runs under
    `accelerator.no_sync(model)` unless `sync` is true or the plugin has `sync_each_batch`. Like
    `accelerator.accumulate`, `sync_gradients` keeps its new value after the block, so an
    `optimizer.step()` after a non-final micro-batch does nothing; if the block raises, it is
    restored. Wrap the forward as well as the backward: DDP decides in the forward.

    Example::

        for i, batch in enumerate(micro_batches):
            with grad_sync(model, i == len(micro_batches) - 1):
                model(**batch).loss.backward()
    """
    if accelerator is not None:
        previous = accelerator.sync_gradients
        accelerator.sync_gradients = sync
        try:
            with _accelerate_no_sync(model, sync, accelerator):
                yield
        except BaseException:
            accelerator.sync_gradients = previous
            raise
    elif sync:
        yield
    elif hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    elif hasattr(model, "no_sync"):
        with model.no_sync():
            yield
    else:
        yield


def _accelerate_no_sync(model: torch.nn.Module, sync: bool, accelerator: Any) -> AbstractContextManager[Any]:
    # Mirrors Accelerator.accumulate: sync_each_batch keeps communication on, but only when distributed.
    sync_each_batch = getattr(accelerator, "use_distributed", False) and accelerator.gradient_state.plugin_kwargs.get(
        "sync_each_batch", False
    )
    if sync or sync_each_batch:
        return nullcontext()
    return accelerator.no_sync(model)
