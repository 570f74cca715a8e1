"""Token-level loss under gradient accumulation and data parallelism: count, reduce and scale (CATALOG §2)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
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

    G_div is `accelerator.gradient_accumulation_steps` (1 without an accelerator): a shorter
    last window is still divided by it. W is `dp_world_size`, else the size of `group`, else
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
        self.grad_divisor = int(accelerator.gradient_accumulation_steps) if accelerator is not None else 1

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
