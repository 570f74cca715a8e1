"""Token-level loss under gradient accumulation and data parallelism: count, reduce and scale (CATALOG §2)."""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, suppress
from itertools import islice
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from lintdist.runtime._dist import all_reduce, data_parallel_world_size
from lintdist.runtime.sync import grad_sync


def microbatch_groups(iterable: Iterable[Any], steps: int) -> Iterator[list[Any]]:
    """Yield consecutive lists of `steps` items; the last list may be shorter.

    Prefetching a whole optimizer step's micro-batches is what makes the token count known
    before the first backward.

    Example:
        >>> list(microbatch_groups(range(7), 3))
        [[0, 1, 2], [3, 4, 5], [6]]
    """
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    iterator = iter(iterable)
    while group := list(islice(iterator, steps)):
        yield group


def shift_labels(labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """The labels a causal LM predicts at each position: `labels[..., 1:]` padded with `ignore_index`.

    Identical to the shift inside transformers' `ForCausalLMLoss`; pass the result as
    `shift_labels` when the sequence is sharded (context parallelism), where a per-shard shift is wrong.

    Example:
        >>> shift_labels(torch.tensor([[5, 6, 7]]))
        tensor([[   6,    7, -100]])
    """
    return F.pad(labels, (0, 1), value=ignore_index)[..., 1:].contiguous()


def count_loss_tokens(
    batches: Mapping[str, Any] | torch.Tensor | Iterable[Mapping[str, Any] | torch.Tensor],
    *,
    labels_key: str = "labels",
    ignore_index: int = -100,
    shifted: bool = False,
) -> torch.Tensor:
    """Number of label positions that contribute to the loss, as a 0-d int64 tensor on the labels' device.

    `batches` is one batch or an iterable of them; a batch is a dict holding `labels_key` or a
    labels tensor. With `shifted=True` (causal LMs shift internally) the positions of
    `labels[..., 1:]` are counted. A dict batch with a `shift_labels` entry is counted from it,
    unshifted, as transformers does.

    Example:
        >>> count_loss_tokens({"labels": torch.tensor([[1, 2, -100]])}, shifted=True)
        tensor(1)
    """
    if isinstance(batches, (Mapping, torch.Tensor)):
        batches = [batches]
    total: torch.Tensor | None = None
    for batch in batches:
        count = _loss_labels(batch, labels_key, shifted).ne(ignore_index).sum()
        total = count if total is None else total + count.to(total.device)
    return total if total is not None else torch.zeros((), dtype=torch.long)


def _loss_labels(batch: Mapping[str, Any] | torch.Tensor, labels_key: str, shifted: bool) -> torch.Tensor:
    if isinstance(batch, torch.Tensor):
        labels = batch
    elif isinstance(batch, Mapping):
        if batch.get("shift_labels") is not None:
            return batch["shift_labels"]
        labels = batch[labels_key]
    else:
        raise TypeError(f"a batch must be a dict with labels or a labels tensor, got {type(batch).__name__}")
    return labels[..., 1:] if shifted else labels


def global_token_count(
    local: torch.Tensor, *, accelerator: Any = None, group: dist.ProcessGroup | None = None
) -> torch.Tensor:
    """Sum of `local` over the data-parallel ranks (one all-reduce); a copy of it without a process group.

    Uses `group` when given, else `accelerator.reduce`, else the default group. The result is on
    `local`'s device.

    Example::

        num_items = global_token_count(count_loss_tokens(micro_batches, shifted=True), accelerator=accelerator)
    """
    if group is None and accelerator is not None:
        return accelerator.reduce(local.to(accelerator.device), reduction="sum").to(local.device)
    return all_reduce(local, dist.ReduceOp.SUM, group)


class TokenLossWindow:
    """One optimizer step's micro-batches on this rank, scaled so the step follows the global token mean.

    After the window's backward passes (through `accelerator.backward`, which divides by
    `accelerator.gradient_accumulation_steps`, or plain `.backward()`) and the data-parallel
    average, the gradient is that of (sum of token losses over all ranks and micro-batches) / N.

    * `num_items`: N, the global count of loss tokens (one all-reduce when the window is built).
    * `sync(i)`: `grad_sync(model, i == last)`.
    * `scale_sum(loss_sum)`: `loss_sum * G_div * W / N`.
    * `scale_mean(loss_mean, batch)`: `loss_mean * n_i * G_div * W / N`; a graph-connected zero
      (no NaN, no DDP hang) for a micro-batch without loss tokens.

    G_div is `grad_divisor`, by default `accelerator.gradient_accumulation_steps` (1 without an
    accelerator): a shorter last window is still divided by it. W is `dp_world_size`, else the size of `group`, else
    `accelerator.num_processes`, else the world size; pass `dp_world_size` and the
    data-parallel `group` under tensor, context or sequence parallelism. N = 0 scales by 0.

    Example::

        for micro_batches in microbatch_groups(loader, accelerator.gradient_accumulation_steps):
            window = TokenLossWindow(micro_batches, accelerator=accelerator, model=model, shifted=True)
            for i, batch in enumerate(micro_batches):
                with window.sync(i):
                    accelerator.backward(window.scale_mean(model(**batch).loss, batch))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    """

    def __init__(
        self,
        micro_batches: Iterable[Any],
        *,
        accelerator: Any = None,
        model: torch.nn.Module | None = None,
        labels_key: str = "labels",
        ignore_index: int = -100,
        shifted: bool = False,
        group: dist.ProcessGroup | None = None,
        dp_world_size: int | None = None,
        grad_divisor: int | None = None,
    ) -> None:
        self.micro_batches = list(micro_batches)
        if not self.micro_batches:
            raise ValueError("a TokenLossWindow needs at least one micro-batch")
        self._accelerator = accelerator
        self._model = model
        self._labels_key = labels_key
        self._ignore_index = ignore_index
        self._shifted = shifted
        self.num_items = global_token_count(self._count(self.micro_batches), accelerator=accelerator, group=group)
        self.world_size = dp_world_size if dp_world_size is not None else data_parallel_world_size(accelerator, group)
        if grad_divisor is None:
            grad_divisor = int(accelerator.gradient_accumulation_steps) if accelerator is not None else 1
        self.grad_divisor = grad_divisor

    def _count(self, batches: Any) -> torch.Tensor:
        return count_loss_tokens(
            batches, labels_key=self._labels_key, ignore_index=self._ignore_index, shifted=self._shifted
        )

    def sync(self, index: int) -> AbstractContextManager[None]:
        """`grad_sync(model, index == last)`: communicate only on the window's last micro-batch."""
        if self._model is None:
            raise ValueError("TokenLossWindow.sync needs the model: TokenLossWindow(..., model=model)")
        return grad_sync(self._model, index == len(self.micro_batches) - 1, accelerator=self._accelerator)

    def _scale(self, loss: torch.Tensor) -> torch.Tensor:
        dtype = torch.promote_types(loss.dtype, torch.float32)
        num_items = self.num_items.to(loss.device, dtype).clamp(min=1)
        return (self.grad_divisor * self.world_size) / num_items

    def scale_sum(self, loss_sum: torch.Tensor) -> torch.Tensor:
        """Scale a sum-reduced loss: `loss_sum * G_div * W / N`."""
        return loss_sum * self._scale(loss_sum)

    def scale_mean(self, loss_mean: torch.Tensor, batch: Any) -> torch.Tensor:
        """Scale `batch`'s mean-reduced loss: `loss_mean * n_i * G_div * W / N`, or a connected 0 if n_i = 0."""
        scale = self._scale(loss_mean)
        tokens = self._count(batch).to(loss_mean.device)
        scaled = loss_mean * (tokens.to(scale.dtype) * scale)
        return torch.where(tokens > 0, scaled, torch.nan_to_num(loss_mean) * 0)


class TokenWindows:
    """Iterate a data loader one gradient-accumulation window ahead, so each loss can be scaled to the global token mean.

    Wrap the loader the training loop iterates, keep the loop as it is, and scale what is passed to
    `backward`: the optimizer step then follows the gradient of (sum of token losses over every
    rank and micro-batch of the window) / N, N the window's global token count.

    * Reading ahead: before yielding a window's first batch, the window's batches are read and their
      loss tokens counted and summed over the data-parallel ranks: one all-reduce per window, none
      per micro-batch. Every rank must see the same number of batches (accelerate's `even_batches`,
      `DistributedSampler`), as for the gradient all-reduce itself.
    * Windows are the ones the loop steps on. With an `accelerator`, a window ends where accelerate
      syncs: after `gradient_accumulation_steps` calls of `accelerator.accumulate` (read from
      `accelerator.step`, so a resumed or `skip_first_batches` loader lines up too) or at the end of
      the loader. Without one, windows are `steps` batches from the start of each pass, the last
      one shorter: the `(step + 1) % steps == 0 or last` gate of a raw DDP loop.
    * accelerate's bookkeeping: reading ahead would make the prepared loader report
      `end_of_dataloader` a window early (accelerate would sync and step mid-window). The wrapper
      therefore stands in for the loader in `accelerator.gradient_state` while it iterates, as the
      prepared loader does itself, and says `end_of_dataloader` only at the last batch it yields
      (and each batch's `remainder` as the loader said it with that batch).
      After the last batch the loader is run to its end, so it counts the epoch as before.
    * `scale_mean(loss, batch)`: `loss * n_i * G_div * W / N` for `batch`'s mean-reduced loss (n_i
      its loss tokens; a graph-connected zero when n_i is 0); `scale_sum(loss_sum)`:
      `loss_sum * G_div * W / N`. G_div is what the loop's `backward` divides by:
      `accelerator.gradient_accumulation_steps` (`accelerator.backward` divides by it, a short
      window included), else `grad_divisor` (a raw loop's `loss / steps`; default 1). W is the
      data-parallel world size (see `TokenLossWindow`).

    `len()` is the loader's. Batches are yielded unchanged; `scale_mean` finds a batch's window by
    identity, so a consumer that reads one batch ahead but passes the yielded object still gets the
    right window (otherwise the window of the last batch yielded is used).

    Example::

        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        token_windows = TokenWindows(loader, accelerator=accelerator, shifted=True)
        for step, batch in enumerate(token_windows):
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(token_windows.scale_mean(loss, batch))
                optimizer.step()
                optimizer.zero_grad()
    """

    def __init__(
        self,
        loader: Iterable[Any],
        *,
        accelerator: Any = None,
        steps: int | None = None,
        labels_key: str = "labels",
        ignore_index: int = -100,
        shifted: bool = False,
        group: dist.ProcessGroup | None = None,
        dp_world_size: int | None = None,
        grad_divisor: int | None = None,
    ) -> None:
        if accelerator is None and steps is None:
            raise ValueError("TokenWindows needs the accelerator, or the accumulation steps of a raw loop (steps=...)")
        if steps is not None and steps < 1:
            raise ValueError(f"steps must be at least 1, got {steps}")
        self.loader = loader
        self._accelerator = accelerator
        self._steps = steps
        self._window_options = {
            "accelerator": accelerator,
            "labels_key": labels_key,
            "ignore_index": ignore_index,
            "shifted": shifted,
            "group": group,
            "dp_world_size": dp_world_size,
            "grad_divisor": grad_divisor,
        }
        self.window: TokenLossWindow | None = None
        self._recent: deque[TokenLossWindow] = deque(maxlen=2)
        # what accelerate's GradientState reads from its active loader
        self.end_of_dataloader = False
        self.remainder = -1

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def _window_size(self) -> int:
        if self._accelerator is None:
            return int(self._steps)  # type: ignore[arg-type]
        steps = int(self._accelerator.gradient_accumulation_steps)
        return steps - int(getattr(self._accelerator, "step", 0)) % steps

    def _read(self, source: Iterator[Any]) -> tuple[list[Any], list[int], bool]:
        """The next window's batches, the loader's `remainder` as each was yielded, and whether the loader ended."""
        batches: list[Any] = []
        remainders: list[int] = []
        for _ in range(self._window_size()):
            try:
                batches.append(next(source))
            except StopIteration:
                return batches, remainders, True
            # DataLoaderDispatcher sets it while yielding its last batch: report it then, not a window early
            remainders.append(getattr(self.loader, "remainder", -1))
            # accelerate's loaders say so while yielding their last batch; asking for one more would end them
            if getattr(self.loader, "end_of_dataloader", False) is True:
                return batches, remainders, True
        return batches, remainders, False

    def __iter__(self) -> Iterator[Any]:
        state = getattr(self._accelerator, "gradient_state", None)
        stands_in = state is not None and hasattr(self.loader, "end_of_dataloader")
        if stands_in and not state.sync_with_dataloader:
            warnings.warn(
                "TokenWindows: with sync_with_dataloader=False an accumulation window can run across epochs; "
                "each epoch's part is normalised by its own token count",
                stacklevel=2,
            )
        source = iter(self.loader)
        pending: deque[tuple[Any, int]] = deque()
        ended = registered = yielded = finished = False
        self.end_of_dataloader = False
        try:
            while True:
                if not pending:
                    if ended:
                        break
                    batches, remainders, ended = self._read(source)
                    if not batches:
                        break
                    if stands_in and not registered:
                        # after the loader's own registration (its first batch), so this is the active one
                        state._add_dataloader(self)
                        registered = True
                    self.window = TokenLossWindow(batches, **self._window_options)
                    self._recent.append(self.window)
                    pending.extend(zip(batches, remainders))
                batch, self.remainder = pending.popleft()
                self.end_of_dataloader = ended and not pending
                yielded = True
                yield batch
            # let the loader finish its pass: accelerate's loaders count the epoch and leave the gradient state here
            for _ in source:
                raise RuntimeError("TokenWindows: the loader yielded a batch after saying it had ended")
            finished = True
        finally:
            if registered and yielded and not finished:
                # Left early (`break`, an exception): accelerate's loader stays registered, as without the wrapper,
                # but it was read ahead; give it the state it had at the last batch the loop saw, or a
                # `gather_for_metrics` or `accumulate` after the loop would see the end of the loader.
                with suppress(AttributeError):
                    self.loader.end_of_dataloader = self.end_of_dataloader  # type: ignore[attr-defined]
                    self.loader.remainder = self.remainder  # type: ignore[attr-defined]
            self.end_of_dataloader = False
            if registered:
                state._remove_dataloader(self)

    def _window_of(self, batch: Any) -> TokenLossWindow:
        for window in reversed(self._recent):
            if any(item is batch for item in window.micro_batches):
                return window
        if self.window is None:
            raise RuntimeError("TokenWindows: scale a loss inside the loop over the TokenWindows object")
        return self.window

    def scale_mean(self, loss_mean: torch.Tensor, batch: Any) -> torch.Tensor:
        """Scale `batch`'s mean-reduced loss: `loss_mean * n_i * G_div * W / N`, or a connected 0 if n_i = 0.

        `batch` is the batch (a dict with the labels) or its labels tensor.
        """
        return self._window_of(batch).scale_mean(loss_mean, batch)

    def scale_sum(self, loss_sum: torch.Tensor, batch: Any = None) -> torch.Tensor:
        """Scale a sum-reduced loss: `loss_sum * G_div * W / N`, N the global count of `batch`'s window."""
        window = self.window if batch is None else self._window_of(batch)
        if window is None:
            raise RuntimeError("TokenWindows: scale a loss inside the loop over the TokenWindows object")
        return window.scale_sum(loss_sum)

    @property
    def num_items(self) -> torch.Tensor:
        """N, the global loss-token count of the window being trained on."""
        if self.window is None:
            raise RuntimeError("TokenWindows: num_items is known once the loop has started")
        return self.window.num_items
