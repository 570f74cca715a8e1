"""Data and optimisation checks: hooks on samplers, loaders, the loss, backward, optimizers and schedulers.

The hooks run on the training thread and only record: a few attribute reads per call, and on the sampled steps a
checksum or a count. Everything that crosses ranks (batch hashes, gradient checksums) is queued in `outbox` and
posted by the watcher thread, never by a collective.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from lintdist.runtime.watch.probe import Site, caller_site, user_frame, user_site
from lintdist.runtime.watch.source import range_bound

# The LD102 check reads the first windows only; the gradient check samples these steps, then every `grad_every`.
TOKEN_WINDOWS = 8
FIRST_GRAD_STEPS = frozenset({1, 2, 3})
TOKEN_WEIGHT_TOLERANCE = 0.05
SCHEDULE_TOLERANCE = 0.05


def _finding(code: str, name: str, message: str, site: Site | None, **evidence: Any) -> dict[str, Any]:
    return {
        "code": code,
        "name": name,
        "severity": "warning",
        "kind": "data",
        "message": message,
        "file": site.file if site else None,
        "line": site.line if site else None,
        "evidence": evidence,
    }


class Checks:
    """Install the hooks once per process; `outbox` holds ("finding", claim, dict) and ("value", kind, key, value)."""

    def __init__(self, world_size: Callable[[], int], grad_every: int = 50) -> None:
        self.world_size = world_size
        self.grad_every = grad_every
        self.outbox: deque[tuple[Any, ...]] = deque()
        self.installed = False
        self._sampler_epochs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._reported: set[str] = set()
        self._ddp_params: set[int] = set()
        self._in_no_sync = 0
        self._no_sync_site: Site | None = None
        self._window_backwards = 0
        self._window_no_sync = 0
        self._optimizer_steps = 0
        self._token_windows = 0
        self._window_losses: list[list[Any]] = []  # [count, ce value, loss value or None, ce site]
        self._schedulers: list[tuple[weakref.ref, Site | None, int | None]] = []
        self._last_loader: weakref.ref | None = None
        self._pending_batch: tuple[str, dict[str, Any]] | None = None
        self._posted_loaders: set[str] = set()

    # -- installation ---------------------------------------------------------------------------------------
    def install(self) -> None:
        if self.installed:
            return
        self.installed = True
        from torch.nn.parallel import DistributedDataParallel as DDP
        from torch.optim.lr_scheduler import LRScheduler
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
        from torch.utils.data import DataLoader, DistributedSampler
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        _wrap(DistributedSampler, "__init__", self._after_init_site)
        _wrap(DistributedSampler, "__iter__", self._sampler_iter, around=True)
        _wrap(DataLoader, "__init__", self._after_init_site)
        _wrap(_BaseDataLoaderIter, "__init__", self._loader_iter_init)
        _wrap(_BaseDataLoaderIter, "__next__", self._loader_next, around=True)
        _wrap(DDP, "__init__", self._ddp_init)
        _wrap(DDP, "no_sync", self._ddp_no_sync, around=True)
        _wrap(torch.Tensor, "backward", self._backward, around=True)
        _wrap(torch.nn.functional, "cross_entropy", self._cross_entropy, around=True)
        _wrap(LRScheduler, "__init__", self._scheduler_init)
        _wrap(LRScheduler, "step", self._scheduler_step)
        register_optimizer_step_pre_hook(_quiet(self._before_step))
        register_optimizer_step_post_hook(_quiet(self._after_step))

    def _report(self, claim: str, finding: dict[str, Any]) -> None:
        if claim not in self._reported:
            self._reported.add(claim)
            self.outbox.append(("finding", claim, finding))

    # -- LD201: a sampler iterated again with the same epoch ------------------------------------------------
    def _after_init_site(self, obj: Any, *_args: Any, **_kwargs: Any) -> None:
        if getattr(obj, "_lintdist_site", None) is None:
            obj._lintdist_site = caller_site()

    def _sampler_iter(self, original: Callable[..., Iterator[Any]], sampler: Any) -> Iterator[Any]:
        with contextlib.suppress(Exception):  # a check must never break the training step
            self._note_sampler(sampler)
        return original(sampler)

    def _note_sampler(self, sampler: Any) -> None:
        epoch, shuffle = getattr(sampler, "epoch", None), getattr(sampler, "shuffle", False)
        try:
            previous = self._sampler_epochs.get(sampler)
            self._sampler_epochs[sampler] = epoch
        except TypeError:
            previous = None
        if shuffle and previous is not None and previous == epoch:
            built, loop = getattr(sampler, "_lintdist_site", None), caller_site()
            self._report(
                f"LD201:{built}",
                _finding(
                    "LD201",
                    "missing-set-epoch",
                    f"the DistributedSampler built at {built} is iterated again at {loop} with epoch {epoch} and "
                    "shuffle=True: this epoch repeats the previous epoch's order on every rank. Call "
                    "`sampler.set_epoch(epoch)` first in the epoch loop (or `lintdist.runtime.set_epoch(loader, epoch)`).",
                    built,
                    epoch=epoch,
                    loop=str(loop),
                ),
            )

    # -- LD203 / LD204: what each rank draws ------------------------------------------------------------------
    def _loader_iter_init(self, iterator: Any, loader: Any, *_args: Any, **_kwargs: Any) -> None:
        iterator._lintdist_loader = weakref.ref(loader)
        iterator._lintdist_first = not getattr(loader, "_lintdist_iterated", False)
        loader._lintdist_iterated = True

    def _loader_next(self, original: Callable[[Any], Any], iterator: Any) -> Any:
        batch = original(iterator)
        with contextlib.suppress(Exception):
            self._note_batch(iterator, batch)
        return batch

    def _note_batch(self, iterator: Any, batch: Any) -> None:
        loader_ref = getattr(iterator, "_lintdist_loader", None)
        loader = loader_ref() if loader_ref else None
        if loader is None:
            return
        self._last_loader = loader_ref
        if iterator._lintdist_first:
            iterator._lintdist_first = False
            self._first_batch(loader, batch)

    def _first_batch(self, loader: Any, batch: Any) -> None:
        world = self.world_size()
        site = getattr(loader, "_lintdist_site", None)
        counts = _loader_counts(loader, batch)
        samplers = _distributed_samplers(loader)
        if world > 1 and counts and samplers and _shares_twice(counts, world):
            sampler_site = getattr(samplers[0], "_lintdist_site", None)
            per_rank, total, _size = counts
            self._report(
                f"LD204:{site}",
                _finding(
                    "LD204",
                    "distributed-sampler-into-prepare",
                    f"each rank draws {per_rank} of the dataset's {total} samples per epoch (1/W² with W={world}; "
                    f"expected {total // world}): the loader at {site} carries the DistributedSampler built at "
                    f"{sampler_site}, and accelerate shards it again. Pass a plain DataLoader to `prepare`.",
                    site,
                    samples_per_rank=per_rank,
                    dataset_length=total,
                    world_size=world,
                    sampler=str(sampler_site),
                ),
            )
        if world > 1 and not samplers:
            value = {"hash": _batch_hash(batch), "counts": counts, "site": site.as_list() if site else None}
            self._pending_batch = (str(site), value)

    # -- LD110 / LD103: gradients that were never averaged -------------------------------------------------
    def _ddp_init(self, module: Any, *_args: Any, **_kwargs: Any) -> None:
        self._ddp_params.update(id(parameter) for parameter in module.parameters())

    def _ddp_no_sync(self, original: Callable[..., Any], module: Any) -> Any:
        return self._counting_no_sync(original(module), caller_site())

    @contextmanager
    def _counting_no_sync(self, inner: Any, site: Site | None) -> Iterator[None]:
        with inner:
            self._in_no_sync += 1
            self._no_sync_site = site
            try:
                yield
            finally:
                self._in_no_sync -= 1

    def _backward(self, original: Callable[..., Any], tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        self._window_backwards += 1
        self._window_no_sync += self._in_no_sync > 0
        if self._window_losses and self._window_losses[-1][2] is None:
            with contextlib.suppress(Exception):
                self._window_losses[-1][2] = tensor.detach().reshape(-1)[0].float() if tensor.numel() else None
        return original(tensor, *args, **kwargs)

    # -- LD102: per-micro-batch token means --------------------------------------------------------------------
    def _cross_entropy(self, original: Callable[..., torch.Tensor], *args: Any, **kwargs: Any) -> torch.Tensor:
        output = original(*args, **kwargs)
        if self._token_windows < TOKEN_WINDOWS and torch.is_grad_enabled():
            with contextlib.suppress(Exception):
                self._note_loss(output, args, kwargs)
        return output

    def _note_loss(self, output: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        reduction = kwargs.get("reduction", args[6] if len(args) > 6 else "mean")
        target = kwargs.get("target", args[1] if len(args) > 1 else None)
        if reduction != "mean" or not isinstance(target, torch.Tensor) or target.is_floating_point():
            return
        if not output.requires_grad:
            return
        ignore_index = kwargs.get("ignore_index", args[4] if len(args) > 4 else -100)
        self._window_losses.append([(target != ignore_index).sum(), output.detach().float(), None, caller_site()])

    def _close_token_window(self) -> None:
        entries, self._window_losses = self._window_losses, []
        if self._token_windows >= TOKEN_WINDOWS or len(entries) < 2:
            return
        self._token_windows += 1
        if any(entry[2] is None for entry in entries):
            return
        values = torch.stack([torch.stack([e[0].float().cpu(), e[1].cpu(), e[2].cpu()]) for e in entries]).tolist()
        counts = [int(count) for count, _, _ in values]
        ratios = [loss / mean if mean else math.nan for _, mean, loss in values]
        if min(counts) <= 0 or any(math.isnan(ratio) for ratio in ratios):
            return
        # Per-micro-batch means: the loss each backward receives is a constant multiple of its micro-batch's token mean.
        if max(ratios) - min(ratios) > 1e-3 * max(abs(r) for r in ratios):
            return
        total, groups = sum(counts), len(counts)
        worst = max(abs(total / (groups * count) - 1.0) for count in counts)
        if worst <= TOKEN_WEIGHT_TOLERANCE:
            return
        site = entries[0][3]
        self._report(
            f"LD102:{site}",
            _finding(
                "LD102",
                "token-loss-not-global",
                f"the {groups} micro-batches of one accumulation window hold {counts} loss tokens, and each backward "
                f"gets its micro-batch's token mean (loss at {site}): a token's weight differs from the window's "
                f"global token mean by up to {worst:.0%}. Divide the summed loss by the window's token count "
                "(lintdist.runtime.TokenLossWindow or TokenWindows).",
                site,
                token_counts=counts,
                worst_weight_error=round(worst, 4),
            ),
        )

    # -- LD503: a schedule that ends early -------------------------------------------------------------------
    def _scheduler_init(self, scheduler: Any, *_args: Any, **_kwargs: Any) -> None:
        scheduler._lintdist_steps = 0
        self._schedulers.append((weakref.ref(scheduler), caller_site(), _schedule_length(scheduler)))

    def _scheduler_step(self, scheduler: Any, *_args: Any, **_kwargs: Any) -> None:
        if hasattr(scheduler, "_lintdist_steps"):
            scheduler._lintdist_steps += 1

    def _check_schedules(self, optimizer: Any) -> None:
        frame = user_frame(sys._getframe(1))
        step_site = user_site(frame)
        epochs = range_bound(step_site, frame.f_locals, frame.f_globals) if frame is not None else None
        loader = self._last_loader() if self._last_loader else None
        try:
            batches = len(loader) if loader is not None else None
        except TypeError:
            batches = None
        accumulation = _accumulation_steps()
        if not batches:
            return
        per_epoch = max(1, batches // accumulation)
        planned = per_epoch * (epochs or 1)
        for ref, site, length in self._schedulers:
            scheduler = ref()
            stepped = getattr(scheduler, "optimizer", None)
            # A scheduler built on accelerate's AcceleratedOptimizer holds the torch optimizer one level down.
            if scheduler is None or length is None or optimizer not in (stepped, getattr(stepped, "optimizer", None)):
                continue
            per_step = scheduler._lintdist_steps
            if per_step <= 1:
                continue
            ends = length / per_step
            if ends >= planned * (1 - SCHEDULE_TOLERANCE):
                continue
            span = f"{epochs} epochs × {per_epoch}" if epochs else f"one epoch of {per_epoch}"
            self._report(
                f"LD503:{site}",
                _finding(
                    "LD503",
                    "scheduler-length-not-scaled",
                    f"the scheduler built at {site} for {length} steps is stepped {per_step} times per optimizer step "
                    f"(a prepared scheduler steps once per process): it reaches its end after {ends:g} optimizer steps, "
                    f"of the {planned} this loop makes ({span} at {step_site}). Build it with "
                    "`lintdist.runtime.scheduler_total_steps(optimizer_steps, accelerator)`.",
                    site,
                    num_training_steps=length,
                    scheduler_steps_per_optimizer_step=per_step,
                    planned_optimizer_steps=planned,
                ),
            )

    # -- the optimizer step --------------------------------------------------------------------------------------
    def _before_step(self, optimizer: Any, _args: Any, _kwargs: Any) -> None:
        self._optimizer_steps += 1
        step = self._optimizer_steps
        self._close_token_window()
        if self._pending_batch is not None:
            key, value = self._pending_batch
            self._pending_batch = None
            if key not in self._posted_loaders and self._ddp_params:
                self._posted_loaders.add(key)
                self.outbox.append(("value", "batch", key, value))
        if step == 2:
            self._check_schedules(optimizer)
        if self._ddp_params and self.world_size() > 1 and (step in FIRST_GRAD_STEPS or step % self.grad_every == 0):
            self._post_gradients(optimizer, step)

    def _after_step(self, _optimizer: Any, _args: Any, _kwargs: Any) -> None:
        self._window_backwards = self._window_no_sync = 0

    def _post_gradients(self, optimizer: Any, step: int) -> None:
        grads = [
            parameter.grad
            for group in optimizer.param_groups
            for parameter in group["params"]
            if id(parameter) in self._ddp_params and parameter.grad is not None
        ]
        if not grads or any(grad.is_sparse or not hasattr(grad, "double") for grad in grads):
            return
        sums = torch.stack([torch.stack([g.detach().double().sum(), g.detach().double().abs().sum()]) for g in grads])
        total, magnitude = sums.sum(0).tolist()
        value = {
            "sum": total,
            "abs": magnitude,
            "site": _as_list(caller_site()),
            "backwards": self._window_backwards,
            "no_sync": self._window_no_sync,
            "no_sync_site": str(self._no_sync_site) if self._no_sync_site else None,
        }
        self.outbox.append(("value", "grad", str(step), value))


def compare_batches(key: str, values: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """LD203 when every rank drew the same first batch from the loader at `key`."""
    hashes = {value["hash"] for value in values.values()}
    if len(values) < 2 or len(hashes) != 1 or None in hashes:
        return None
    counts = values[min(values)].get("counts")
    drawn = (
        f"each rank draws {counts[0]} of the dataset's {counts[1]} samples per epoch"
        if counts
        else "each rank draws the whole loader"
    )
    return _finding(
        "LD203",
        "ddp-loader-without-distributed-sampler",
        f"all {len(values)} ranks drew the same first batch from the loader at {key}, and {drawn}: every rank trains on "
        "the same data. Give the DataLoader `sampler=DistributedSampler(dataset)` (and call `set_epoch`).",
        Site.from_list(values[min(values)].get("site")),
        loader=key,
        ranks=len(values),
        samples_per_rank=counts[0] if counts else None,
        dataset_length=counts[1] if counts else None,
    )


def compare_gradients(step: str, values: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """LD110/LD103 when the ranks hold different gradients right before `optimizer.step`."""
    sums = [value["sum"] for value in values.values()]
    scale = max(max(abs(value["abs"]) for value in values.values()), 1e-30)
    spread = (max(sums) - min(sums)) / scale
    if len(values) < 2 or spread <= 1e-6:
        return None
    first = values[min(values)]
    all_no_sync = all(v["backwards"] and v["no_sync"] == v["backwards"] for v in values.values())
    code, name = ("LD110", "model-no-sync-misuse") if all_no_sync else ("LD103", "ddp-accumulation-without-no-sync")
    cause = (
        f"every backward of the window ran under `no_sync` ({first['no_sync_site']})"
        if all_no_sync
        else "the gradient all-reduce did not run for this step's backward"
    )
    return _finding(
        code,
        name,
        f"the ranks' gradients differ right before optimizer step {step} at {Site.from_list(first['site'])} (relative spread "
        f"{spread:.2e}): {cause}, so each rank steps on its own gradients and the replicas drift apart. Leave the last "
        "micro-batch of each window outside `no_sync` (lintdist.runtime.grad_sync(model, sync=is_last)).",
        Site.from_list(first["site"]),
        step=int(step),
        relative_spread=spread,
        checksums={str(rank): value["sum"] for rank, value in values.items()},
    )


def _quiet(hook: Callable[..., None]) -> Callable[..., None]:
    """`hook`, with its exceptions swallowed: a check must never break the training step."""

    @functools.wraps(hook)
    def quiet(*args: Any, **kwargs: Any) -> None:
        with contextlib.suppress(Exception):
            hook(*args, **kwargs)

    return quiet


def _as_list(site: Site | None) -> list[Any] | None:
    return site.as_list() if site else None


def _wrap(owner: Any, name: str, hook: Callable[..., Any], *, around: bool = False) -> None:
    """Replace `owner.name` by a wrapper: `hook(original, *args)` when `around`, else call it, then `hook(*args)`."""
    original = getattr(owner, name)
    if getattr(original, "_lintdist_watch", False):
        return
    if around:

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return hook(original, *args, **kwargs)

    else:

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            with contextlib.suppress(Exception):  # a check must never break the training step
                hook(*args, **kwargs)
            return result

    wrapper._lintdist_watch = True
    setattr(owner, name, wrapper)


def _loader_counts(loader: Any, batch: Any) -> tuple[int, int, int] | None:
    """(samples this rank draws per epoch, dataset length, batch size), when they are known."""
    try:
        batches, total = len(loader), len(loader.dataset)
    except (TypeError, AttributeError, NotImplementedError):
        return None
    size = _batch_size(batch)
    return (batches * size, total, size) if size else None


def _batch_size(batch: Any) -> int | None:
    for tensor in _tensors(batch):
        if tensor.dim() > 0:
            return int(tensor.shape[0])
    return None


def _tensors(batch: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        yield batch
    elif depth < 3 and isinstance(batch, dict):
        for key in sorted(batch, key=str):
            yield from _tensors(batch[key], depth + 1)
    elif depth < 3 and isinstance(batch, (list, tuple)):
        for item in batch:
            yield from _tensors(item, depth + 1)


def _batch_hash(batch: Any) -> str | None:
    parts = []
    for tensor in _tensors(batch):
        flat = tensor.detach().reshape(-1)[:65536].double().cpu()
        weights = torch.arange(1, flat.numel() + 1, dtype=torch.float64)
        parts.append(f"{tuple(tensor.shape)}:{flat.sum().item():.17g}:{(flat * weights).sum().item():.17g}")
    return "|".join(parts) or None


def _distributed_samplers(loader: Any) -> list[Any]:
    from torch.utils.data import DistributedSampler

    found, seen = [], set()
    stack = [loader]
    for _ in range(12):
        if not stack:
            break
        obj = stack.pop()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, DistributedSampler):
            found.append(obj)
        stack.extend(getattr(obj, name, None) for name in ("sampler", "batch_sampler"))
    return found


def _shares_twice(counts: tuple[int, int, int], world: int) -> bool:
    """The rank draws 1/W² of the dataset, to within one batch."""
    per_rank, total, size = counts
    return total >= world * world * size and abs(per_rank - total / (world * world)) <= size


def _schedule_length(scheduler: Any) -> int | None:
    """The number of steps the schedule is built for, where the scheduler says it."""
    for attribute in ("total_steps", "total_iters", "T_max"):
        value = getattr(scheduler, attribute, None)
        if isinstance(value, int) and value > 0:
            return value
    for function in getattr(scheduler, "lr_lambdas", None) or ():
        keywords = getattr(function, "keywords", None) or {}
        value = keywords.get("num_training_steps")
        if isinstance(value, int) and value > 0:
            return value
    return None


def _accumulation_steps() -> int:
    state = sys.modules.get("accelerate.state")
    if state is None:
        return 1
    try:
        return max(1, int(state.GradientState().num_steps))
    except Exception:  # noqa: BLE001 - accelerate's state is not set up: no accumulation to read
        return 1
