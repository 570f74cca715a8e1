"""Epoch and schedule bookkeeping: sampler epochs, scheduler lengths under accelerate."""

from __future__ import annotations

from typing import Any


def set_epoch(loader_or_sampler: Any, epoch: int) -> None:
    """Call `set_epoch(epoch)` once on each distinct object that has one.

    The objects are the argument itself, its `sampler`, its `batch_sampler` and that batch
    sampler's `sampler`, and its `dataset` (Lightning's `_set_sampler_epoch` checks the two
    samplers; accelerate's loaders, custom batch samplers and streaming datasets carry their
    own). Without it a `DistributedSampler` repeats the same permutation every epoch.

    Example::

        for epoch in range(epochs):
            set_epoch(train_loader, epoch)
            for batch in train_loader:
                ...
    """
    batch_sampler = getattr(loader_or_sampler, "batch_sampler", None)
    candidates = (
        loader_or_sampler,
        getattr(loader_or_sampler, "sampler", None),
        batch_sampler,
        getattr(batch_sampler, "sampler", None),
        getattr(loader_or_sampler, "dataset", None),
    )
    # Samplers may be unhashable, so deduplicate by identity.
    targets = {id(obj): obj for obj in candidates if callable(getattr(obj, "set_epoch", None))}
    for obj in targets.values():
        obj.set_epoch(epoch)


def scheduler_total_steps(optimizer_steps: int, accelerator: Any) -> int:
    """The length to give a scheduler that goes through `accelerator.prepare`.

    `AcceleratedScheduler.step` steps the wrapped scheduler `num_processes` times per optimizer
    step, unless `split_batches` or `step_scheduler_with_optimizer=False`; a schedule built for
    `optimizer_steps` would otherwise end after 1/W of training.

    Example::

        total = scheduler_total_steps(epochs * len(train_loader) // accumulation, accelerator)
        scheduler = get_linear_schedule_with_warmup(optimizer, warmup, total)
    """
    if accelerator.split_batches or not accelerator.step_scheduler_with_optimizer:
        return optimizer_steps
    return optimizer_steps * int(accelerator.num_processes)
