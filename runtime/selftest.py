"""Self-test: check lintdist.runtime against single-process references on this machine or cluster.

    torchrun --nproc_per_node N -m lintdist.runtime.selftest [--backend gloo|nccl]
    python -m lintdist.runtime.selftest                         # one process, no launcher

Each check runs on every rank and returns a `Verdict`; rank 0 prints one line per check and
every rank exits 1 if any rank saw a mismatch. The backend is NCCL when CUDA is available,
else gloo. The test suite runs the same check functions under its own process groups.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import gc
import importlib.util
import itertools
import math
import os
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from lintdist.runtime import (
    TokenLossWindow,
    TokenWindows,
    any_rank,
    count_loss_tokens,
    grad_sync,
    main_process_first,
    microbatch_groups,
    scheduler_total_steps,
    set_epoch,
    shift_labels,
)
from lintdist.runtime._dist import barrier

IGNORE_INDEX = -100
VOCAB = 11
HIDDEN = 4
LEARNING_RATE = 0.1
FLOAT64_TOLERANCE = 1e-9
# bf16 autocast: relative to the largest reference gradient entry.
AUTOCAST_RELATIVE_TOLERANCE = 5e-2
# A wrong recipe "differs" when it misses the reference by far more than rounding.
MISMATCH_THRESHOLD = 1e-6

SETUP_NAMES = {
    "plain": "plain module",
    "ddp": "raw DDP",
    "accelerate": "accelerate",
    "fsdp1": "FSDP1",
    "fsdp2": "FSDP2",
}
WRONG_RECIPES = {
    "mean-per-micro-batch": "per-micro-batch mean",
    "local-count": "local token count",
    "no-world-factor": "no W factor",
}


@dataclass(frozen=True)
class Context:
    """Where the checks run: this rank, the world size, the device, and whether a process group exists."""

    rank: int
    world_size: int
    device: torch.device
    distributed: bool


@dataclass(frozen=True)
class Verdict:
    """The outcome of one check on one rank; `line()` is what the self-test prints."""

    helper: str
    setup: str
    status: str
    detail: str
    metrics: dict[str, float] = field(default_factory=dict)
    variant: str = ""

    @property
    def passed(self) -> bool:
        return self.status != "FAIL"

    def line(self) -> str:
        variant = f" [{self.variant}]" if self.variant else ""
        return f"{self.status} {self.helper} ({self.setup}): {self.detail}{variant}"


@dataclass(frozen=True)
class TokenLossCase:
    """One token-loss equivalence run.

    `lengths[rank][micro_batch]` lists the unpadded length of each sequence (0 = all padding);
    every rank has the same number of micro-batches, grouped `accumulation` at a time (the last
    window may be shorter). `reduction` "sum" uses `scale_sum`, "mean" uses `scale_mean`.
    `recipe` is "correct" or a key of WRONG_RECIPES (sum-reduced forms). `autocast` runs the
    forward under bf16 autocast with float32 parameters; otherwise everything is float64.
    """

    setup: str
    accumulation: int
    lengths: tuple[tuple[tuple[int, ...], ...], ...]
    reduction: str = "sum"
    shifted: bool = False
    recipe: str = "correct"
    extra_padding: int = 1
    seed: int = 0
    autocast: bool = False


def free_port() -> int:
    """A TCP port that was free a moment ago, for MASTER_PORT."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def init_distributed(backend: str | None = None, timeout_s: float = 120.0) -> Context:
    """Join the process group that torchrun's environment describes, or create a one-process group.

    NCCL on `cuda:LOCAL_RANK` when CUDA is available (or `backend="nccl"`), else gloo on CPU.
    """
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
        os.environ["MASTER_PORT"] = str(free_port())
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return Context(rank=dist.get_rank(), world_size=dist.get_world_size(), device=device, distributed=True)


def shutdown_distributed() -> None:
    """Destroy the process group after the models that hold it."""
    # DDP reducers and FSDP states left in reference cycles must die before their process group,
    # or gloo's threads abort the process at exit ("terminate called without an active exception").
    gc.collect()
    barrier()
    dist.destroy_process_group()


def local_context(device: torch.device | str = "cpu") -> Context:
    """A context for running checks in this process without a process group."""
    return Context(rank=0, world_size=1, device=torch.device(device), distributed=False)


class TinyCausalLM(torch.nn.Module):
    """Embedding, tanh and a vocabulary head: small enough for one DDP bucket, deterministic per seed."""

    def __init__(self, seed: int, dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN, dtype=dtype)
        self.head = torch.nn.Linear(HIDDEN, VOCAB, dtype=dtype)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for parameter in self.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator, dtype=dtype))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # Written out so that the output is not a view (FSDP2 warns about views).
        return torch.tanh(self.embed(input_ids)) @ self.head.weight.T + self.head.bias


def token_loss(logits: torch.Tensor, labels: torch.Tensor, *, shifted: bool, reduction: str) -> torch.Tensor:
    """Cross-entropy over the loss tokens, shifting like a causal LM when `shifted`."""
    targets = shift_labels(labels, IGNORE_INDEX) if shifted else labels
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction=reduction
    )


def canonical_lengths(
    world_size: int, micro_batches: int = 7, max_length: int = 6
) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """Variable lengths and batch sizes that differ within and across ranks; rank 0's second micro-batch is all padding."""

    def micro_batch(rank: int, step: int) -> tuple[int, ...]:
        sizes = range(1 + (rank + step) % 3)
        if (rank, step) == (0, 1):
            return tuple(0 for _ in sizes)
        return tuple((3 * rank + 5 * step + 2 * seq) % (max_length + 1) for seq in sizes)

    return tuple(tuple(micro_batch(rank, step) for step in range(micro_batches)) for rank in range(world_size))


def micro_batch_token_counts(case: TokenLossCase) -> list[list[int]]:
    """n[rank][micro_batch]: the loss tokens of each micro-batch, computed from the lengths alone."""
    drop = 1 if case.shifted else 0
    return [[sum(max(length - drop, 0) for length in step) for step in rank] for rank in case.lengths]


def wrong_recipes_expected_to_differ(case: TokenLossCase) -> list[str]:
    """The wrong recipes whose token weighting or scale differs from the reference's on `case`.

    The others coincide with the reference exactly there (e.g. every recipe but the
    per-micro-batch mean with one rank).
    """
    counts = micro_batch_token_counts(case)
    steps = len(counts[0])
    windows = [range(start, min(start + case.accumulation, steps)) for start in range(0, steps, case.accumulation)]
    expected = []
    if any(len({counts[r][g] for r in range(len(counts)) for g in window}) > 1 for window in windows):
        expected.append("mean-per-micro-batch")
    if any(len({sum(counts[r][g] for g in window) for r in range(len(counts))}) > 1 for window in windows):
        expected.append("local-count")
    if len(counts) > 1 and any(sum(row) for row in counts):
        expected.append("no-world-factor")
    return expected


def build_micro_batches(case: TokenLossCase, rank: int, device: torch.device) -> list[dict[str, torch.Tensor]]:
    """The micro-batches of `rank`: random tokens, `-100` labels on padding, padded to the longest + extra."""
    generator = torch.Generator().manual_seed(case.seed * 1_000_003 + rank)
    batches = []
    for lengths in case.lengths[rank]:
        width = max(max(lengths) + case.extra_padding, 1)
        input_ids = torch.randint(1, VOCAB, (len(lengths), width), generator=generator)
        padding = torch.arange(width) >= torch.tensor(lengths)[:, None]
        batches.append(
            {
                "input_ids": input_ids.masked_fill(padding, 0).to(device),
                "labels": input_ids.masked_fill(padding, IGNORE_INDEX).to(device),
            }
        )
    return batches


def reference_step(
    model: torch.nn.Module, batches: Sequence[dict[str, torch.Tensor]], shifted: bool
) -> tuple[float, list[torch.Tensor]]:
    """Single-process global token mean and its gradient, written out without lintdist.runtime."""
    total: torch.Tensor | float = 0.0
    count = 0
    for batch in batches:
        logits, labels = model(batch["input_ids"]), batch["labels"]
        if shifted:
            logits, labels = logits[:, :-1], labels[:, 1:]
        total = total + F.cross_entropy(
            logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
        )
        count += int(labels.ne(IGNORE_INDEX).sum())
    loss = total / max(count, 1)
    return float(loss.detach()), list(torch.autograd.grad(loss, list(model.parameters())))


def _accelerator(ctx: Context, accumulation: int = 1) -> Any:
    from accelerate import Accelerator

    return Accelerator(cpu=ctx.device.type == "cpu", gradient_accumulation_steps=accumulation)


def _wrap(
    ctx: Context, setup: str, model: torch.nn.Module, accumulation: int
) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any, str]:
    """Put `model` under `setup`; returns the model to call, its optimizer, the accelerator (or None), a label."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    label = f"{SETUP_NAMES[setup]}, W={ctx.world_size}, G={accumulation}"
    if setup == "plain":
        return model, optimizer, None, label
    if setup == "ddp":
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids), optimizer, None, label
    if setup == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        fully_shard(model, mesh=init_device_mesh(ctx.device.type, (ctx.world_size,)))
        return model, torch.optim.SGD(model.parameters(), lr=LEARNING_RATE), None, label
    if setup == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel

        wrapped = FullyShardedDataParallel(model, device_id=ctx.device, use_orig_params=True)
        return wrapped, torch.optim.SGD(wrapped.parameters(), lr=LEARNING_RATE), None, label
    accelerator = _accelerator(ctx, accumulation)
    wrapped, optimizer = accelerator.prepare(model, optimizer)
    label = label.replace("accelerate", f"accelerate {accelerator.distributed_type.value}")
    return wrapped, optimizer, accelerator, label


def _full_gradients(model: torch.nn.Module) -> list[torch.Tensor]:
    """The unsharded gradient of every parameter (a collective under FSDP1 and FSDP2)."""
    summon = getattr(model, "summon_full_params", None)
    if summon is not None:
        with summon(model, with_grads=True):
            return [parameter.grad.detach().clone() for parameter in model.parameters()]
    grads = []
    for parameter in model.parameters():
        grad = parameter.grad
        grads.append(grad.full_tensor() if hasattr(grad, "full_tensor") else grad.detach().clone())
    return grads


def _recipe_loss(
    case: TokenLossCase, window: TokenLossWindow, logits: torch.Tensor, batch: dict[str, torch.Tensor]
) -> torch.Tensor:
    labels = batch["labels"]
    if case.recipe == "correct" and case.reduction == "mean":
        return window.scale_mean(token_loss(logits, labels, shifted=case.shifted, reduction="mean"), batch)
    loss_sum = token_loss(logits, labels, shifted=case.shifted, reduction="sum")
    if case.recipe == "correct":
        return window.scale_sum(loss_sum)
    if case.recipe == "mean-per-micro-batch":
        # `accumulate` + `.loss` (accelerate divides by G), or `loss / G` in a raw loop.
        loss_mean = torch.nan_to_num(token_loss(logits, labels, shifted=case.shifted, reduction="mean"))
        return loss_mean * window.grad_divisor / case.accumulation
    if case.recipe == "local-count":
        local = count_loss_tokens(window.micro_batches, shifted=case.shifted).clamp(min=1)
        return loss_sum * window.grad_divisor / local
    if case.recipe == "no-world-factor":
        return window.scale_sum(loss_sum) / window.world_size
    raise ValueError(f"unknown recipe {case.recipe!r}")


def check_token_loss(ctx: Context, case: TokenLossCase) -> Verdict:
    """Train `case` under its setup and compare every window's gradient with the global token mean's."""
    if len(case.lengths) != ctx.world_size:
        raise ValueError(f"case has {len(case.lengths)} ranks, the world has {ctx.world_size}")
    dtype = torch.float32 if case.autocast else torch.float64
    model = TinyCausalLM(case.seed, dtype).to(ctx.device)
    reference = copy.deepcopy(model)
    wrapped, optimizer, accelerator, label = _wrap(ctx, case.setup, model, case.accumulation)
    batches = [build_micro_batches(case, rank, ctx.device) for rank in range(ctx.world_size)]
    autocast = torch.autocast(ctx.device.type, dtype=torch.bfloat16) if case.autocast else nullcontext()
    max_error = reference_max = loss_error = 0.0
    squares = [0.0, 0.0]
    first_window_ratio = 1.0
    synced_after_window = True
    for index, local in enumerate(microbatch_groups(batches[ctx.rank], case.accumulation)):
        start = index * case.accumulation
        everyone = [batch for rank_batches in batches for batch in rank_batches[start : start + len(local)]]
        expected_loss, expected = reference_step(reference, everyone, case.shifted)
        window = TokenLossWindow(local, accelerator=accelerator, model=wrapped, shifted=case.shifted)
        window_loss = torch.zeros((), dtype=torch.float64, device=ctx.device)
        for i, batch in enumerate(local):
            with window.sync(i):
                with autocast:
                    logits = wrapped(batch["input_ids"])
                loss = _recipe_loss(case, window, logits, batch)
                window_loss += loss.detach()
                if accelerator is None:
                    loss.backward()
                else:
                    accelerator.backward(loss)
            if accelerator is not None:
                if i == len(local) - 1:
                    grads = _full_gradients(wrapped)
                    synced_after_window &= bool(accelerator.sync_gradients)
                # AcceleratedOptimizer.step and zero_grad must do nothing until the window's last micro-batch.
                optimizer.step()
                optimizer.zero_grad()
        if accelerator is None:
            grads = _full_gradients(wrapped)
            optimizer.step()
            optimizer.zero_grad()
        for got, want in zip(grads, expected, strict=True):
            # A NaN must fail the comparison, and max() would drop it.
            error = (got.double() - want.double()).abs().max().nan_to_num(nan=math.inf)
            max_error = max(max_error, float(error))
            reference_max = max(reference_max, float(want.abs().max()))
            squares[0] += float(got.double().square().sum())
            squares[1] += float(want.double().square().sum())
        if ctx.distributed:
            dist.all_reduce(window_loss)
        # What a loop would log: the scaled losses summed over the window and ranks, over G_div * W.
        logged = float(window_loss) / (window.grad_divisor * window.world_size)
        loss_error = max(loss_error, abs(logged - expected_loss) if math.isfinite(logged) else math.inf)
        if index == 0 and squares[1]:
            # Later windows start from parameters that a wrong recipe has already moved.
            first_window_ratio = math.sqrt(squares[0] / squares[1])
        with torch.no_grad():
            for parameter, grad in zip(reference.parameters(), expected, strict=True):
                parameter.sub_(LEARNING_RATE * grad)
    tolerance = AUTOCAST_RELATIVE_TOLERANCE * reference_max if case.autocast else FLOAT64_TOLERANCE
    loss_tolerance = AUTOCAST_RELATIVE_TOLERANCE if case.autocast else FLOAT64_TOLERANCE
    ratio = math.sqrt(squares[0] / squares[1]) if squares[1] else 1.0
    passed = max_error <= tolerance and loss_error <= loss_tolerance and synced_after_window
    variant = ", ".join(
        part
        for part in (
            "bf16 autocast" if case.autocast else "",
            case.recipe if case.recipe != "correct" else f"scale_{case.reduction}",
            "shifted" if case.shifted else "unshifted",
        )
        if part
    )
    detail = f"max |grad - ref| = {max_error:.1e}, |grad|/|ref| = {ratio:.4f}, |loss - ref| = {loss_error:.1e}"
    if not synced_after_window:
        detail += ", accelerator.sync_gradients was False after a window"
    return Verdict(
        "token-loss",
        label,
        "PASS" if passed else "FAIL",
        detail,
        {
            "max_error": max_error,
            "norm_ratio": ratio,
            "first_window_norm_ratio": first_window_ratio,
            "loss_error": loss_error,
            "reference_max": reference_max,
            "tolerance": tolerance,
        },
        variant,
    )


def _ranks_max_difference(ctx: Context, tensors: Sequence[torch.Tensor]) -> float:
    """Largest difference between this gradient on rank 0 and on any rank (0 with one rank)."""
    flat = torch.cat([tensor.reshape(-1) for tensor in tensors])
    gathered = [torch.empty_like(flat) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, flat)
    return max(float((other - gathered[0]).abs().max()) for other in gathered)


class _Probe(Exception):
    """Raised inside a block to check that a context manager cleans up."""


def _grad_sync_setup(
    ctx: Context, setup: str, accumulation: int, model: torch.nn.Module
) -> tuple[torch.nn.Module, Any, str, list[dict[str, torch.Tensor]], Callable[[dict[str, torch.Tensor]], None]]:
    """The wrapped model, its accelerator (or None), its label, this rank's micro-batches, and a backward of one."""
    wrapped, _, accelerator, label = _wrap(ctx, setup, model, accumulation)
    case = TokenLossCase(setup, accumulation, canonical_lengths(ctx.world_size, accumulation), seed=1)
    batches = build_micro_batches(case, ctx.rank, ctx.device)

    def backward(batch: dict[str, torch.Tensor]) -> None:
        loss = token_loss(wrapped(batch["input_ids"]), batch["labels"], shifted=False, reduction="sum")
        if accelerator is None:
            loss.backward()
        else:
            accelerator.backward(loss)

    return wrapped, accelerator, label.replace(f", G={accumulation}", ""), batches, backward


def check_grad_sync(ctx: Context, setup: str, accumulation: int = 3) -> Verdict:
    """No gradient communication before a window's last micro-batch; state restored on exit and on error."""
    if setup == "fsdp2":
        return _check_grad_sync_fsdp2(ctx, accumulation)
    if setup == "fsdp1":
        return _check_grad_sync_fsdp1(ctx, accumulation)
    model = TinyCausalLM(seed=1).to(ctx.device)
    wrapped, accelerator, label, batches, backward = _grad_sync_setup(ctx, setup, accumulation, model)
    if not isinstance(wrapped, torch.nn.parallel.DistributedDataParallel):
        return Verdict("grad-sync", label, "SKIP", "the prepared model is not DDP here (one process)")
    calls = [0]

    # No annotations: DDP compares them with dist.GradBucket, and this module's are strings.
    def counting_allreduce(state, bucket):  # type: ignore[no-untyped-def]
        state[0] += 1
        return allreduce_hook(None, bucket)

    wrapped.register_comm_hook(calls, counting_allreduce)

    backward(batches[0])
    buckets, calls[0] = calls[0], 0
    wrapped.zero_grad(set_to_none=True)
    for batch in batches:
        backward(batch)
    calls_without_grad_sync, calls[0] = calls[0], 0
    wrapped.zero_grad(set_to_none=True)
    differ_before_last = 0.0
    for i, batch in enumerate(batches):
        last = i == len(batches) - 1
        if last:
            calls_before_last = calls[0]
            differ_before_last = _ranks_max_difference(ctx, [p.grad for p in wrapped.parameters()])
        with grad_sync(wrapped, last, accelerator=accelerator):
            backward(batch)
    calls_with_grad_sync = calls[0]
    differ_after_last = _ranks_max_difference(ctx, [p.grad for p in wrapped.parameters()])

    states = []
    with grad_sync(wrapped, False, accelerator=accelerator):
        states.append(wrapped.require_backward_grad_sync)
    states.append(wrapped.require_backward_grad_sync)
    if accelerator is not None:
        states.append(accelerator.sync_gradients)
        accelerator.sync_gradients = True
    try:
        with grad_sync(wrapped, False, accelerator=accelerator):
            raise _Probe
    except _Probe:
        states.append(wrapped.require_backward_grad_sync)
    if accelerator is not None:
        states.append(accelerator.sync_gradients)

    skips = accelerator is None or bool(accelerator.use_distributed)
    expected_states = [not skips, True] + ([False] if accelerator else []) + [True] + ([True] if accelerator else [])
    problems = []
    if buckets < 1 or calls_without_grad_sync != accumulation * buckets:
        problems.append(f"hook count is off without grad_sync ({calls_without_grad_sync} for {buckets} bucket(s))")
    if calls_before_last != (0 if skips else (accumulation - 1) * buckets):
        problems.append(f"{calls_before_last} all-reduce(s) before the last micro-batch")
    if calls_with_grad_sync != (buckets if skips else accumulation * buckets):
        problems.append(f"{calls_with_grad_sync} all-reduce(s) per window")
    if ctx.world_size > 1 and differ_before_last == 0.0:
        problems.append("ranks' gradients were equal before the last backward")
    if differ_after_last != 0.0:
        problems.append(f"ranks' gradients differ by {differ_after_last:.1e} after the window")
    if states != expected_states:
        problems.append(f"sync state {states}, expected {expected_states}")
    detail = (
        f"{calls_with_grad_sync} all-reduce(s) per window of {accumulation} ({buckets} bucket(s)), "
        f"{calls_without_grad_sync} without grad_sync; state restored on exit and on exceptions"
    )
    if not skips:
        detail += " (accelerate's no_sync does nothing with one process)"
    return Verdict(
        "grad-sync",
        label,
        "FAIL" if problems else "PASS",
        "; ".join(problems) or detail,
        {
            "buckets": buckets,
            "calls_per_window": calls_with_grad_sync,
            "calls_before_last": calls_before_last,
            "calls_without_grad_sync": calls_without_grad_sync,
            "ranks_differ_before_last": differ_before_last,
            "ranks_differ_after_last": differ_after_last,
        },
    )


def _check_grad_sync_fsdp1(ctx: Context, accumulation: int) -> Verdict:
    # FSDP1's no_sync keeps unsharded local gradients; the synced backward reduce-scatters them.
    model = TinyCausalLM(seed=1).to(ctx.device)
    # Outside forward and backward, FSDP1's parameters are views of this rank's shard.
    shapes = [parameter.shape for parameter in model.parameters()]
    wrapped, _, label, batches, backward = _grad_sync_setup(ctx, "fsdp1", accumulation, model)

    for i, batch in enumerate(batches):
        last = i == len(batches) - 1
        if last:
            local = [parameter.grad for parameter in wrapped.parameters()]
            unsharded = all(grad is not None and grad.shape == shape for grad, shape in zip(local, shapes))
            differ_before_last = _ranks_max_difference(ctx, local) if unsharded else 0.0
        with grad_sync(wrapped, last):
            backward(batch)
    differ_after_last = _ranks_max_difference(ctx, _full_gradients(wrapped))
    wrapped.zero_grad(set_to_none=True)
    try:
        with grad_sync(wrapped, False):
            raise _Probe
    except _Probe:
        backward(batches[0])
    differ_after_exception = _ranks_max_difference(ctx, _full_gradients(wrapped))
    passed = (
        unsharded
        and (ctx.world_size == 1 or differ_before_last > 0)
        and differ_after_last == 0
        and differ_after_exception == 0
    )
    detail = (
        "local unsharded gradients before the last micro-batch, reduced at the last; sync restored after an exception"
        if passed
        else f"unsharded before last {unsharded}, ranks differ by {differ_before_last:.1e} before the last, "
        f"{differ_after_last:.1e} after it, {differ_after_exception:.1e} after an exception"
    )
    return Verdict(
        "grad-sync",
        label,
        "PASS" if passed else "FAIL",
        detail,
        {"ranks_differ_before_last": differ_before_last, "ranks_differ_after_last": differ_after_last},
    )


def _check_grad_sync_fsdp2(ctx: Context, accumulation: int) -> Verdict:
    # FSDP2 writes the sharded .grad only when it reduce-scatters, so .grad stays None while not syncing.
    model = TinyCausalLM(seed=1).to(ctx.device)
    wrapped, _, label, batches, backward = _grad_sync_setup(ctx, "fsdp2", accumulation, model)

    def reduced() -> bool:
        return all(parameter.grad is not None for parameter in wrapped.parameters())

    backward(batches[0])
    reduced_without_grad_sync = reduced()
    wrapped.zero_grad(set_to_none=True)
    reduced_before_last = False
    for i, batch in enumerate(batches):
        with grad_sync(wrapped, i == len(batches) - 1):
            backward(batch)
        if i < len(batches) - 1:
            reduced_before_last |= reduced()
    reduced_after_last = reduced()
    wrapped.zero_grad(set_to_none=True)
    try:
        with grad_sync(wrapped, False):
            raise _Probe
    except _Probe:
        backward(batches[0])
    reduced_after_exception = reduced()
    passed = reduced_without_grad_sync and not reduced_before_last and reduced_after_last and reduced_after_exception
    detail = (
        "no reduce-scatter before the last micro-batch, one at the last; sync restored after an exception"
        if passed
        else f"reduced: without grad_sync {reduced_without_grad_sync}, before last {reduced_before_last}, "
        f"after last {reduced_after_last}, after exception {reduced_after_exception}"
    )
    return Verdict(
        "grad-sync",
        label,
        "PASS" if passed else "FAIL",
        detail,
        {"reduced_before_last": float(reduced_before_last), "reduced_after_last": float(reduced_after_last)},
    )


def _all_gather_object(ctx: Context, value: Any) -> list[Any]:
    if not ctx.distributed:
        return [value]
    gathered: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(gathered, value)
    return gathered


def check_set_epoch(ctx: Context, epochs: int = 3, samples_per_rank: int = 8) -> Verdict:
    """`set_epoch` on a loader: a new permutation each epoch, disjoint across ranks, covering the dataset."""
    from torch.utils.data import DataLoader, DistributedSampler

    dataset = list(range(ctx.world_size * samples_per_rank))
    sampler = DistributedSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, sampler=sampler, batch_size=3)
    orders = []
    for epoch in range(epochs):
        set_epoch(loader, epoch)
        orders.append([int(index) for batch in loader for index in batch])
    repeated_without = [int(index) for batch in loader for index in batch] == orders[-1]
    everyone = _all_gather_object(ctx, orders)
    per_epoch = [[index for rank_orders in everyone for index in rank_orders[epoch]] for epoch in range(epochs)]
    disjoint = all(sorted(indices) == dataset for indices in per_epoch)
    distinct = len({tuple(indices) for indices in per_epoch}) == epochs
    passed = disjoint and distinct and repeated_without and sampler.epoch == epochs - 1
    detail = (
        f"{epochs} epochs, each a different permutation, disjoint across {ctx.world_size} rank(s) and covering "
        f"all {len(dataset)} samples; without set_epoch the order repeats"
    )
    if not passed:
        detail = f"disjoint and covering: {disjoint}, distinct epochs: {distinct}, repeats without: {repeated_without}"
    return Verdict(
        "set-epoch",
        f"DistributedSampler, W={ctx.world_size}",
        "PASS" if passed else "FAIL",
        detail,
        {"disjoint": float(disjoint), "distinct": float(distinct)},
    )


def check_main_process_first(
    ctx: Context, *, accelerate: bool = False, local: bool = False, directory: str | None = None
) -> Verdict:
    """The others see the main's file on entry; an exception on the main still releases them and re-raises."""
    accelerator = _accelerator(ctx) if accelerate else None
    name = [f"lintdist-main-first-{uuid.uuid4().hex}"]
    if ctx.distributed:
        dist.broadcast_object_list(name, src=0)
    path = Path(directory or tempfile.gettempdir()) / name[0]
    hosts = _all_gather_object(ctx, socket.gethostname())
    first = (int(os.environ.get("LOCAL_RANK", ctx.rank)) if local else ctx.rank) == 0
    # Without `local`, only ranks on rank 0's host can see its file.
    can_see = local or hosts[ctx.rank] == hosts[0]
    seen_on_entry = True
    with main_process_first(accelerator=accelerator, local=local):
        if first:
            time.sleep(0.2)
            path.write_text("written by the main process")
        elif can_see:
            seen_on_entry = path.exists()
    entered, raised = False, False
    try:
        with main_process_first(accelerator=accelerator, local=local):
            entered = True
            if first:
                raise _Probe("failure on the main process")
    except _Probe:
        raised = True
    everyone = _all_gather_object(ctx, (seen_on_entry, entered, raised == first))
    if first:
        path.unlink()
    passed = all(all(flags) for flags in everyone)
    flavour = ("accelerate" if accelerate else "torch.distributed") + (", local" if local else "")
    detail = (
        f"{ctx.world_size - 1} other rank(s) saw the main's file on entry; an exception on the main released "
        "them and was re-raised there"
    )
    return Verdict(
        "main-process-first",
        f"{flavour}, W={ctx.world_size}",
        "PASS" if passed else "FAIL",
        detail if passed else f"(saw the file, entered, raised only on the main) per rank: {everyone}",
    )


def check_any_rank(ctx: Context, *, accelerate: bool = False, stop_step: int = 3, max_steps: int = 8) -> Verdict:
    """The last rank raises a flag at `stop_step`: every rank leaves the loop at that step."""
    accelerator = _accelerator(ctx) if accelerate else None
    stopped_at = None
    for step in range(max_steps):
        flag = torch.tensor(ctx.rank == ctx.world_size - 1 and step == stop_step, device=ctx.device)
        if any_rank(flag, accelerator=accelerator):
            stopped_at = step
            break
    everyone = _all_gather_object(ctx, stopped_at)
    passed = all(step == stop_step for step in everyone)
    flavour = "accelerate" if accelerate else "torch.distributed"
    detail = f"all {ctx.world_size} rank(s) stopped at step {stop_step}" if passed else f"stopped at {everyone}"
    return Verdict("any-rank", f"{flavour}, W={ctx.world_size}", "PASS" if passed else "FAIL", detail)


def _schedule_end(ctx: Context, optimizer_steps: int, accumulation: int, use_helper: bool) -> int | None:
    """The optimizer step at which a linear decay to 0 reaches 0 under accelerate, or None."""
    accelerator = _accelerator(ctx, accumulation)
    total = scheduler_total_steps(optimizer_steps, accelerator) if use_helper else optimizer_steps
    model = TinyCausalLM(seed=2).to(ctx.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, 1.0 - step / total))
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    case = TokenLossCase("accelerate", accumulation, canonical_lengths(ctx.world_size, optimizer_steps * accumulation))
    batches = build_micro_batches(case, ctx.rank, ctx.device)
    for step, micro_batches in enumerate(microbatch_groups(batches, accumulation), start=1):
        window = TokenLossWindow(micro_batches, accelerator=accelerator, model=model)
        for i, batch in enumerate(micro_batches):
            with window.sync(i):
                loss_sum = token_loss(model(batch["input_ids"]), batch["labels"], shifted=False, reduction="sum")
                accelerator.backward(window.scale_sum(loss_sum))
            # Both are skipped by accelerate until the window's last micro-batch.
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        if scheduler.get_last_lr()[0] == 0.0:
            return step
    return None


def check_scheduler_total_steps(ctx: Context, optimizer_steps: int = 4, accumulation: int = 2) -> Verdict:
    """A linear-decay LambdaLR built for `scheduler_total_steps(K)` reaches 0 exactly at optimizer step K."""
    end = _schedule_end(ctx, optimizer_steps, accumulation, use_helper=True)
    naive_end = _schedule_end(ctx, optimizer_steps, accumulation, use_helper=False)
    return Verdict(
        "scheduler-total-steps",
        f"accelerate LambdaLR, W={ctx.world_size}, G={accumulation}",
        "PASS" if end == optimizer_steps else "FAIL",
        f"last value at optimizer step {end} of {optimizer_steps} (built for K steps instead: step {naive_end})",
        {"end": float(end or 0), "naive_end": float(naive_end or 0)},
    )


TOKEN_WINDOWS_BATCH_SIZE = 2


def token_windows_examples(world_size: int, batches_per_rank: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Per-example dicts of 1 to 6 tokens, a -100 prompt of 0 to 2 tokens, every label of global batch 1 masked."""
    generator = torch.Generator().manual_seed(seed)
    examples = []
    for index in range(world_size * batches_per_rank * TOKEN_WINDOWS_BATCH_SIZE):
        input_ids = torch.randint(1, VOCAB, (1 + (7 * index + 3) % 6,), generator=generator)
        labels = input_ids.clone()
        labels[: index % 3] = IGNORE_INDEX
        if index // TOKEN_WINDOWS_BATCH_SIZE == 1:
            labels[:] = IGNORE_INDEX
        examples.append({"input_ids": input_ids, "labels": labels})
    return examples


def pad_collate(examples: Sequence[dict[str, torch.Tensor]], width: int | None = None) -> dict[str, torch.Tensor]:
    """Pad to `width`, by default the longest example plus one column: input 0, label -100."""
    width = width or max(len(example["input_ids"]) for example in examples) + 1

    def pad(key: str, value: int) -> torch.Tensor:
        return torch.stack([F.pad(example[key], (0, width - len(example[key])), value=value) for example in examples])

    return {"input_ids": pad("input_ids", 0), "labels": pad("labels", IGNORE_INDEX)}


class _Stream(torch.utils.data.IterableDataset):
    """The examples as an iterable dataset: accelerate dispatches its batches from rank 0 (DataLoaderDispatcher)."""

    def __init__(self, examples: Sequence[dict[str, torch.Tensor]]) -> None:
        self.examples = examples

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return iter(self.examples)


@dataclass
class _WindowsRun:
    """What one training loop over TokenWindows (or over the bare loader) did."""

    steps: int = 0
    # Per micro-batch: the values a loop and accelerate read (sync, end of loader, remainder); per epoch: its end state.
    trace: list[tuple[Any, ...]] = field(default_factory=list)
    errors: list[float] = field(default_factory=list)
    count_mismatches: int = 0
    references: int = 0
    # Epochs after which accelerate's GradientState still had a loader (or the wrapper) registered.
    left_in_dataloader: int = 0


def _window_gradient_error(
    ctx: Context,
    run: _WindowsRun,
    model: torch.nn.Module,
    window: Sequence[dict[str, torch.Tensor]],
    num_items: torch.Tensor | None,
    shifted: bool,
) -> None:
    """Compare `model`'s gradient with the global token mean's over every rank's `window`, at the same weights."""
    local = [{key: value.detach().cpu() for key, value in batch.items()} for batch in window]
    everyone = [
        {key: value.to(ctx.device) for key, value in batch.items()}
        for rank_batches in _all_gather_object(ctx, local)
        for batch in rank_batches
    ]
    reference = copy.deepcopy(model)
    _, expected = reference_step(reference, everyone, shifted)
    grads = [parameter.grad for parameter in model.parameters()]
    error = 0.0
    for got, want in zip(grads, expected, strict=True):
        got = torch.full_like(want, math.nan) if got is None else got
        error = max(error, float((got.double() - want.double()).abs().max().nan_to_num(nan=math.inf)))
    run.errors.append(error)
    run.references += 1
    if num_items is not None and int(num_items) != int(count_loss_tokens(everyone, shifted=shifted)):
        run.count_mismatches += 1


def _windows_loss(
    token_windows: TokenWindows | None,
    logits: torch.Tensor,
    batch: dict[str, torch.Tensor],
    reduction: str,
    shifted: bool,
) -> torch.Tensor:
    if token_windows is None:
        # The bare loop: what is passed to backward only matters for the sync pattern here.
        return token_loss(logits, batch["labels"], shifted=shifted, reduction="sum")
    loss = token_loss(logits, batch["labels"], shifted=shifted, reduction=reduction)
    return token_windows.scale_mean(loss, batch) if reduction == "mean" else token_windows.scale_sum(loss, batch)


def _token_windows_accelerate_run(
    ctx: Context,
    *,
    wrap: bool,
    skip: int,
    restored_step: int,
    epochs: int,
    batches_per_rank: int,
    accumulation: int,
    iterable: bool = False,
    **loss: Any,
) -> tuple[_WindowsRun, str]:
    """A no_trainer-style loop: `accumulate`, `accelerator.backward`, step and zero_grad on every micro-batch.

    The first epoch skips `skip` batches with `skip_first_batches`, starting from `accelerator.step =
    restored_step` (what `load_state` restores from a checkpoint saved in the middle of a window). With
    `iterable`, the loader reads an IterableDataset (batches padded to one width, as dispatching needs).
    """
    from torch.utils.data import DataLoader

    accelerator = _accelerator(ctx, accumulation)
    run = _WindowsRun()
    model = TinyCausalLM(seed=4).to(ctx.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    optimizer.register_step_post_hook(lambda *_: setattr(run, "steps", run.steps + 1))
    examples = token_windows_examples(ctx.world_size, batches_per_rank)
    if iterable:
        collate = functools.partial(pad_collate, width=max(len(example["input_ids"]) for example in examples) + 1)
        loader = DataLoader(_Stream(examples), batch_size=TOKEN_WINDOWS_BATCH_SIZE, collate_fn=collate)
    else:
        loader = DataLoader(examples, batch_size=TOKEN_WINDOWS_BATCH_SIZE, collate_fn=pad_collate)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    state = accelerator.gradient_state
    accelerator.step = restored_step
    # One wrapper for every epoch, as a loop built before the epoch loop has it; another for the resumed epoch.
    every_epoch = TokenWindows(loader, accelerator=accelerator, shifted=loss["shifted"]) if wrap else None
    for epoch in range(epochs):
        source, token_windows = loader, every_epoch
        if epoch == 0 and skip:
            source = accelerator.skip_first_batches(loader, skip)
            token_windows = TokenWindows(source, accelerator=accelerator, shifted=loss["shifted"]) if wrap else None
        window: list[dict[str, torch.Tensor]] = []
        for batch in token_windows if token_windows is not None else source:
            with accelerator.accumulate(model):
                accelerator.backward(_windows_loss(token_windows, model(batch["input_ids"]), batch, **loss))
                window.append(batch)
                run.trace.append((accelerator.sync_gradients, state.end_of_dataloader, state.remainder))
                if accelerator.sync_gradients:
                    if token_windows is not None:
                        num_items = token_windows.num_items
                        _window_gradient_error(
                            ctx, run, accelerator.unwrap_model(model), window, num_items, loss["shifted"]
                        )
                    window = []
                optimizer.step()
                optimizer.zero_grad()
        registered = token_windows is not None and token_windows in state.dataloader_references
        run.left_in_dataloader += state.in_dataloader or registered
        run.trace.append(("epoch end", state.in_dataloader, registered, loader.iteration, accelerator.step))
    label = f"accelerate {accelerator.distributed_type.value}, W={ctx.world_size}, G={accumulation}"
    return run, label + (f", {type(loader).__name__}" if iterable else "")


def _token_windows_ddp_run(
    ctx: Context,
    *,
    wrap: bool,
    skip: int,
    restored_step: int,
    epochs: int,
    batches_per_rank: int,
    accumulation: int,
    grad_divisor: int | None = None,
    **loss: Any,
) -> tuple[_WindowsRun, str]:
    """A raw DDP loop: DistributedSampler, `no_sync()` unless `(i + 1) % G == 0 or last`, plain backward.

    With `grad_divisor`, the loop divides what goes to backward by it and tells TokenWindows so.
    """
    from torch.utils.data import DataLoader, DistributedSampler

    if skip or restored_step:
        raise ValueError("the raw loop has no resume case")
    run = _WindowsRun()
    model = TinyCausalLM(seed=4).to(ctx.device)
    wrapped, optimizer, _, label = _wrap(ctx, "ddp" if ctx.distributed else "plain", model, accumulation)
    optimizer.register_step_post_hook(lambda *_: setattr(run, "steps", run.steps + 1))
    examples = token_windows_examples(ctx.world_size, batches_per_rank)
    sampler = DistributedSampler(examples, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=5)
    loader = DataLoader(examples, batch_size=TOKEN_WINDOWS_BATCH_SIZE, sampler=sampler, collate_fn=pad_collate)
    token_windows = None
    if wrap:
        token_windows = TokenWindows(loader, steps=accumulation, shifted=loss["shifted"], grad_divisor=grad_divisor)
    for epoch in range(epochs):
        set_epoch(loader, epoch)
        window: list[dict[str, torch.Tensor]] = []
        for i, batch in enumerate(token_windows if token_windows is not None else loader):
            batch = {key: value.to(ctx.device) for key, value in batch.items()}
            sync = (i + 1) % accumulation == 0 or i == len(loader) - 1
            with nullcontext() if sync or not hasattr(wrapped, "no_sync") else wrapped.no_sync():
                # With grad_divisor=G, the loop's own `loss / G` (what TokenWindows multiplies back).
                (
                    _windows_loss(token_windows, wrapped(batch["input_ids"]), batch, **loss) / (grad_divisor or 1)
                ).backward()
            window.append(batch)
            run.trace.append((sync,))
            if sync:
                if token_windows is not None:
                    _window_gradient_error(ctx, run, model, window, token_windows.num_items, loss["shifted"])
                window = []
                optimizer.step()
                optimizer.zero_grad()
        run.trace.append(("epoch end", sampler.epoch))
    return run, label.replace("plain module", "raw loop, no process group")


def _accelerate_optimizer_steps(epoch_lengths: Sequence[int], accumulation: int, step: int = 0) -> int:
    """How many times `accumulate` syncs over these epochs: every G calls and at each loader's end."""
    syncs = 0
    for length in epoch_lengths:
        for index in range(length):
            step = 0 if index == length - 1 else step + 1
            syncs += step % accumulation == 0
    return syncs


def check_token_windows(
    ctx: Context,
    setup: str = "accelerate",
    *,
    reduction: str = "mean",
    shifted: bool = True,
    accumulation: int = 3,
    batches_per_rank: int = 7,
    epochs: int = 2,
    skip: int = 2,
    grad_divisor: int | None = None,
    iterable: bool = False,
) -> Verdict:
    """A real loop over `TokenWindows`: every optimizer step follows the global token mean of its window.

    `setup` "accelerate": `accumulate` + `accelerator.backward(token_windows.scale_mean(loss, batch))` over a
    prepared DataLoader whose epochs end on a short window, for `epochs` epochs; then again with the first epoch
    resumed by `skip_first_batches(loader, skip)`, from `accelerator.step` 0 and from `skip % G` (a checkpoint
    saved mid-window). "ddp": a raw DDP loop with `no_sync()` and the `(i + 1) % G == 0 or last` gate (with
    `grad_divisor`, backward of `scale_mean(...) / grad_divisor` and `TokenWindows(..., grad_divisor=...)`).
    `iterable`: the accelerate loop over an IterableDataset (accelerate's DataLoaderDispatcher). At every
    synced step the gradient is compared with the float64 reference over all ranks' micro-batches of that window,
    at the same weights; the optimizer steps, the sync pattern, accelerate's `end_of_dataloader` and `remainder`,
    the loader's epoch counter and `in_dataloader` after each epoch must be those of the loop without the wrapper.
    """
    if reduction not in ("sum", "mean"):
        raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")
    loop = {"accelerate": _token_windows_accelerate_run, "ddp": _token_windows_ddp_run}[setup]
    if grad_divisor is not None and setup != "ddp":
        raise ValueError("grad_divisor is for the raw loop; accelerate's backward divides by G itself")
    options: dict[str, Any] = {"epochs": epochs, "batches_per_rank": batches_per_rank, "accumulation": accumulation}
    if grad_divisor is not None:
        options["grad_divisor"] = grad_divisor
    if iterable:
        if setup != "accelerate":
            raise ValueError("iterable is for the accelerate loop")
        options["iterable"] = True
    loss = {"reduction": reduction, "shifted": shifted}
    cases = {"": (0, 0)}
    if setup == "accelerate" and skip:
        cases |= {"resume_": (skip, 0), "resume_mid_window_": (skip, skip % accumulation)}
    problems = []
    metrics: dict[str, float] = {}
    label = ""
    for prefix, (resume, restored_step) in cases.items():
        wrapped, label = loop(ctx, wrap=True, skip=resume, restored_step=restored_step, **options, **loss)
        bare, _ = loop(ctx, wrap=False, skip=resume, restored_step=restored_step, **options, **loss)
        lengths = [batches_per_rank - resume] + [batches_per_rank] * (epochs - 1)
        if setup == "accelerate":
            expected_steps = _accelerate_optimizer_steps(lengths, accumulation, restored_step)
        else:
            expected_steps = sum(math.ceil(length / accumulation) for length in lengths)
        error = max(wrapped.errors, default=math.inf)
        metrics |= {
            f"{prefix}max_error": error,
            f"{prefix}steps": float(wrapped.steps),
            f"{prefix}steps_without_wrapper": float(bare.steps),
            f"{prefix}expected_steps": float(expected_steps),
            f"{prefix}compared_steps": float(wrapped.references),
            f"{prefix}pattern_matches": float(wrapped.trace == bare.trace),
        }
        name = prefix.rstrip("_").replace("_", " ") or "fresh"
        if not error <= FLOAT64_TOLERANCE:
            problems.append(f"{name}: max |grad - ref| = {error:.1e}")
        if not wrapped.steps == bare.steps == wrapped.references == expected_steps:
            problems.append(
                f"{name}: {wrapped.steps} optimizer steps ({wrapped.references} compared), "
                f"{bare.steps} without the wrapper, {expected_steps} expected"
            )
        if wrapped.trace != bare.trace:
            problems.append(f"{name}: per batch and epoch {wrapped.trace} != without the wrapper {bare.trace}")
        if wrapped.left_in_dataloader:
            problems.append(f"{name}: in_dataloader still True after {wrapped.left_in_dataloader} epoch(s)")
        if wrapped.count_mismatches:
            problems.append(f"{name}: num_items missed the window's token count {wrapped.count_mismatches}x")
    metrics["max_error"] = max(value for key, value in metrics.items() if key.endswith("max_error"))
    detail = (
        f"max |grad - ref| = {metrics['max_error']:.1e} at all {metrics['steps']:.0f} optimizer steps of {epochs} "
        f"epochs of {batches_per_rank} micro-batches"
    )
    if len(cases) > 1:
        detail += (
            f" and of the runs resumed after {skip} (at accelerator.step 0 and {skip % accumulation}: "
            f"{metrics['resume_steps']:.0f} and {metrics['resume_mid_window_steps']:.0f} steps)"
        )
    detail += "; steps, syncs and loader state as without the wrapper"
    variant = f"scale_{reduction}, {'shifted' if shifted else 'unshifted'}"
    if grad_divisor is not None:
        variant += f", loss / {grad_divisor}"
    return Verdict(
        "token-windows", label, "FAIL" if problems else "PASS", "; ".join(problems) or detail, metrics, variant
    )


def check_shift_labels(ctx: Context, seed: int = 3) -> Verdict:
    """Loss and token count with `shift_labels` equal the causal-LM shift of `logits[:, :-1]` against `labels[:, 1:]`."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, VOCAB, (3, 7), generator=generator)
    labels[torch.rand(labels.shape, generator=generator) < 0.3] = IGNORE_INDEX
    logits = torch.randn(3, 7, VOCAB, generator=generator, dtype=torch.float64)
    labels, logits = labels.to(ctx.device), logits.to(ctx.device)
    textbook = F.cross_entropy(
        logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    shifted = shift_labels(labels, IGNORE_INDEX)
    ours = F.cross_entropy(logits.reshape(-1, VOCAB), shifted.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum")
    counts = {
        int(count_loss_tokens({"labels": labels}, shifted=True)),
        int(count_loss_tokens({"labels": labels, "shift_labels": shifted})),
        int(labels[:, 1:].ne(IGNORE_INDEX).sum()),
    }
    error = float((ours - textbook).abs())
    passed = error <= FLOAT64_TOLERANCE and len(counts) == 1
    return Verdict(
        "shift-labels",
        f"{ctx.device.type}",
        "PASS" if passed else "FAIL",
        f"|loss - causal-LM loss| = {error:.1e}, token counts {sorted(counts)}",
    )


_WATCH_CHANNELS = itertools.count()


def check_watch_channel(ctx: Context, timeout_s: float = 30.0) -> Verdict:
    """The watcher's side channel: each rank reads every rank's post, one claim wins, and no collective is added.

    It opens the store client `python -m lintdist.runtime.watch` opens (MASTER_ADDR/MASTER_PORT, else a clone of
    the process group's store) and compares the flight recorder's collective counters before and after.
    """
    from lintdist.runtime.watch import probe
    from lintdist.runtime.watch.channel import Channel

    setup = f"store client, W={ctx.world_size}"
    if not ctx.distributed:
        return Verdict("watch-channel", setup, "SKIP", "needs a process group (run under torchrun)")
    before = probe.progress()
    channel, where = Channel.open(ctx.rank, ctx.world_size, namespace=f"selftest/{next(_WATCH_CHANNELS)}/")
    channel.post_status({"rank": ctx.rank, "token": f"rank-{ctx.rank}"})
    channel.post_finding("selftest", {"rank": ctx.rank})
    channel.post_value("done", "posted", ctx.rank)
    deadline = time.monotonic() + timeout_s
    while channel.values("done", "posted") is None and time.monotonic() < deadline:
        time.sleep(0.05)
    statuses = channel.statuses()
    everyone = sorted(statuses) == list(range(ctx.world_size)) and all(
        status["token"] == f"rank-{rank}" for rank, status in statuses.items()
    )
    claims = len(channel.new_findings())
    after = probe.progress()
    unchanged = before == after
    passed = everyone and claims == 1 and unchanged
    detail = f"{ctx.world_size} rank(s) read every rank's post through {where}; one claim of {ctx.world_size} won; "
    detail += "no collective added" if unchanged else f"collective counters moved: {before} -> {after}"
    if not everyone:
        detail = f"rank {ctx.rank} read posts from ranks {sorted(statuses)} only"
    return Verdict(
        "watch-channel",
        setup,
        "PASS" if passed else "FAIL",
        detail,
        {"ranks_seen": float(len(statuses)), "claims": float(claims), "collectives_unchanged": float(unchanged)},
    )


def _unavailable(setup: str) -> str | None:
    """Why `setup` cannot run here, or None."""
    if setup == "accelerate" and importlib.util.find_spec("accelerate") is None:
        return "accelerate is not installed"
    if setup == "fsdp2" and not hasattr(importlib.import_module("torch.distributed.fsdp"), "fully_shard"):
        return f"torch {torch.__version__} has no torch.distributed.fsdp.fully_shard"
    return None


def _summary(verdicts: list[Verdict]) -> Verdict:
    """One verdict for several variants of a check: the worst one, named."""
    worst = max(verdicts, key=lambda verdict: (not verdict.passed, verdict.metrics.get("max_error", 0.0)))
    status = "PASS" if all(verdict.passed for verdict in verdicts) else "FAIL"
    variant = f"worst of {len(verdicts)}: {worst.variant}"
    return dataclasses.replace(worst, status=status, variant=variant)


def check_wrong_recipes(ctx: Context, case: TokenLossCase) -> Verdict:
    """The common wrong recipes must miss the reference wherever the math says they do (so the check can fail)."""
    runs = {recipe: check_token_loss(ctx, dataclasses.replace(case, recipe=recipe)) for recipe in WRONG_RECIPES}
    expected = wrong_recipes_expected_to_differ(case)
    missed = [recipe for recipe in expected if runs[recipe].metrics["max_error"] <= MISMATCH_THRESHOLD]
    detail = ", ".join(
        f"{WRONG_RECIPES[recipe]} |grad|/|ref| = {run.metrics['norm_ratio']:.3f} "
        f"(max err {run.metrics['max_error']:.1e}{'' if recipe in expected else ', exact here'})"
        for recipe, run in runs.items()
    )
    metrics = {f"{recipe}:{key}": value for recipe, run in runs.items() for key, value in run.metrics.items()}
    prefix = f"wrong recipes matched the reference: {missed}; " if missed else "wrong recipes differ as expected: "
    return Verdict(
        "token-loss-wrong-recipes", runs["local-count"].setup, "FAIL" if missed else "PASS", prefix + detail, metrics
    )


def selftest_verdicts(ctx: Context) -> Iterator[Verdict]:
    """Every check, with the canonical lengths for this world size: one verdict per helper and setup."""
    lengths = canonical_lengths(ctx.world_size)
    for setup in ("ddp", "accelerate", "fsdp1", "fsdp2"):
        reason = _unavailable(setup)
        if reason:
            yield Verdict("token-loss", SETUP_NAMES[setup], "SKIP", reason)
            continue
        for accumulation in (1, 3):
            yield _summary(
                [
                    check_token_loss(ctx, TokenLossCase(setup, accumulation, lengths, reduction, shifted))
                    for reduction in ("sum", "mean")
                    for shifted in (False, True)
                ]
            )
        yield check_wrong_recipes(ctx, TokenLossCase(setup, 3, lengths))
        yield check_grad_sync(ctx, setup)
    yield check_token_loss(ctx, TokenLossCase("ddp", 3, lengths, reduction="mean", shifted=True, autocast=True))
    yield check_set_epoch(ctx)
    yield check_any_rank(ctx)
    yield check_main_process_first(ctx)
    yield check_main_process_first(ctx, local=True)
    if _unavailable("accelerate") is None:
        yield check_any_rank(ctx, accelerate=True)
        yield check_main_process_first(ctx, accelerate=True)
        yield check_scheduler_total_steps(ctx)
        yield check_token_windows(ctx, "accelerate")
        yield check_token_windows(ctx, "accelerate", iterable=True)
    yield check_token_windows(ctx, "ddp")
    yield check_shift_labels(ctx)
    yield check_watch_channel(ctx)


def merge_ranks(ctx: Context, verdicts: list[Verdict]) -> list[Verdict]:
    """Each check's verdict as rank 0 saw it, unless another rank failed it."""
    merged = []
    for per_rank in zip(*_all_gather_object(ctx, verdicts), strict=True):
        merged.append(next((verdict for verdict in per_rank if not verdict.passed), per_rank[0]))
    return merged


def report(verdicts: Sequence[Verdict], stream: TextIO | None = None) -> int:
    """Print one line per verdict (to stdout by default); 0 when nothing failed, else 1."""
    stream = stream or sys.stdout
    for verdict in verdicts:
        print(verdict.line(), file=stream, flush=True)
    failed = sum(not verdict.passed for verdict in verdicts)
    print(f"{'FAIL' if failed else 'PASS'}: {len(verdicts) - failed}/{len(verdicts)} checks passed", file=stream)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m lintdist.runtime.selftest`."""
    parser = argparse.ArgumentParser(prog="python -m lintdist.runtime.selftest", description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("gloo", "nccl"), help="default: nccl with CUDA, else gloo")
    parser.add_argument("--timeout", type=float, default=120.0, help="process-group timeout in seconds")
    args = parser.parse_args(argv)
    ctx = init_distributed(args.backend, args.timeout)
    verdicts = merge_ranks(ctx, list(selftest_verdicts(ctx)))
    shutdown_distributed()
    if ctx.rank == 0:
        return report(verdicts)
    return 0 if all(verdict.passed for verdict in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
