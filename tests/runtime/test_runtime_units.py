"""Single-process behaviour of lintdist.runtime: pure functions, no-process-group paths, duck-typed objects."""

from __future__ import annotations

import doctest
import functools
import subprocess
import sys
import types
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from runtime_harness import token_loss_cases

import lintdist.runtime.process
import lintdist.runtime.tokens
from lintdist.runtime import (
    TokenLossWindow,
    TokenWindows,
    any_rank,
    count_loss_tokens,
    global_token_count,
    grad_sync,
    main_process_first,
    microbatch_groups,
    scheduler_total_steps,
    selftest,
    sequence_parallel_group,
    set_epoch,
    shift_labels,
)

IGNORE = -100


def labels_tensors(max_rows: int = 3, max_cols: int = 6) -> st.SearchStrategy[torch.Tensor]:
    shape = st.tuples(st.integers(1, max_rows), st.integers(1, max_cols))
    return shape.flatmap(
        lambda s: st.lists(
            st.one_of(st.just(IGNORE), st.integers(0, 9)), min_size=s[0] * s[1], max_size=s[0] * s[1]
        ).map(lambda values, s=s: torch.tensor(values).reshape(s))
    )


@given(st.lists(st.integers()), st.integers(1, 5))
def test_microbatch_groups_chunks_in_order_with_a_short_tail(items: list[int], steps: int) -> None:
    groups = list(microbatch_groups(iter(items), steps))
    assert [item for group in groups for item in group] == items
    assert all(len(group) == steps for group in groups[:-1])
    assert len(groups) == -(-len(items) // steps)
    assert all(groups)


def test_microbatch_groups_rejects_a_step_count_below_one() -> None:
    with pytest.raises(ValueError):
        list(microbatch_groups([1, 2], 0))


@given(labels_tensors())
def test_shift_labels_is_the_causal_lm_shift(labels: torch.Tensor) -> None:
    shifted = shift_labels(labels)
    assert shifted.shape == labels.shape
    assert torch.equal(shifted[..., :-1], labels[..., 1:])
    assert (shifted[..., -1] == IGNORE).all()
    assert shifted.is_contiguous()
    assert (shift_labels(labels, ignore_index=-1)[..., -1] == -1).all()


@settings(max_examples=30, deadline=None)
@given(labels_tensors(), st.integers(0, 2**16))
def test_shift_labels_gives_transformers_causal_lm_loss(labels: torch.Tensor, seed: int) -> None:
    causal_lm_loss = pytest.importorskip("transformers.loss.loss_utils").ForCausalLMLoss

    vocab = 10
    logits = torch.randn(*labels.shape, vocab, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    # num_items_in_batch=1 makes transformers sum, so a misaligned token changes the value.
    internal = causal_lm_loss(logits, labels, vocab, num_items_in_batch=1)
    ours = causal_lm_loss(logits, None, vocab, num_items_in_batch=1, shift_labels=shift_labels(labels))
    assert torch.equal(ours, internal)
    mean_internal = causal_lm_loss(logits, labels, vocab)
    mean_ours = causal_lm_loss(logits, None, vocab, shift_labels=shift_labels(labels))
    assert torch.equal(mean_ours, mean_internal) or (mean_ours.isnan() and mean_internal.isnan())


@settings(max_examples=30, deadline=None)
@given(st.lists(labels_tensors(), min_size=1, max_size=4), st.booleans())
def test_count_loss_tokens_matches_the_transformers_trainer(batches: list[torch.Tensor], shifted: bool) -> None:
    # transformers 5 counts causal-LM items over labels[..., 1:] (`_loss_shifts_labels`).
    trainer_class = pytest.importorskip("transformers", minversion="5.0").Trainer

    trainer = SimpleNamespace(
        model_accepts_loss_kwargs=True,
        compute_loss_func=None,
        _loss_shifts_labels=shifted,
        args=SimpleNamespace(average_tokens_across_devices=False, n_gpu=1, world_size=1),
        get_tp_size=lambda: 1,
        get_cp_size=lambda: 1,
        get_sp_size=lambda: 1,
    )
    dict_batches = [{"labels": labels} for labels in batches]
    expected = trainer_class._get_num_items_in_batch(trainer, dict_batches, torch.device("cpu"))
    assert int(count_loss_tokens(dict_batches, shifted=shifted)) == int(expected)
    with_shift_key = [{"labels": labels, "shift_labels": shift_labels(labels)} for labels in batches]
    expected = trainer_class._get_num_items_in_batch(trainer, with_shift_key, torch.device("cpu"))
    assert int(count_loss_tokens(with_shift_key, shifted=shifted)) == int(expected)


def test_count_loss_tokens_accepts_tensors_dicts_generators_and_custom_keys() -> None:
    labels = torch.tensor([[IGNORE, 1, 2, IGNORE], [3, 4, IGNORE, IGNORE]])
    assert count_loss_tokens(labels).item() == 4
    assert count_loss_tokens(labels, shifted=True).item() == 3
    assert count_loss_tokens({"target": labels}, labels_key="target").item() == 4
    assert count_loss_tokens(b for b in [labels, {"labels": labels}]).item() == 8
    assert count_loss_tokens({"labels": labels, "shift_labels": None}, shifted=True).item() == 3
    assert count_loss_tokens(labels.masked_fill(labels == IGNORE, -1), ignore_index=-1).item() == 4
    assert count_loss_tokens([]).item() == 0
    assert count_loss_tokens(labels).dtype == torch.long
    with pytest.raises(TypeError, match="dict with labels or a labels tensor"):
        count_loss_tokens([(torch.zeros(2), labels)])


def test_collectives_are_identities_without_a_process_group() -> None:
    local = torch.tensor(7)
    total = global_token_count(local)
    assert total.item() == 7 and total is not local
    assert any_rank(True) is True and any_rank(False) is False
    assert any_rank(torch.tensor([False, True])) is True
    order = []
    with main_process_first():
        order.append("block")
    with pytest.raises(RuntimeError), main_process_first(local=True):
        raise RuntimeError("propagates")
    assert order == ["block"]


class FakeFSDP2(torch.nn.Linear):
    """A module with FSDP2's sync switch that records how it was flipped."""

    def __init__(self) -> None:
        super().__init__(1, 1)
        self.calls: list[bool] = []

    def set_requires_gradient_sync(self, requires_gradient_sync: bool) -> None:
        self.calls.append(requires_gradient_sync)


class FakeAccelerator:
    """The attributes of accelerate.Accelerator that grad_sync and TokenLossWindow read."""

    def __init__(self, *, use_distributed: bool = True, sync_each_batch: bool = False, steps: int = 4) -> None:
        self.sync_gradients = True
        self.use_distributed = use_distributed
        self.gradient_state = SimpleNamespace(plugin_kwargs={"sync_each_batch": sync_each_batch})
        self.gradient_accumulation_steps = steps
        self.num_processes = 3
        self.device = torch.device("cpu")
        self.no_sync_entered: list[Any] = []
        self.reductions = 0

    @contextmanager
    def no_sync(self, model: torch.nn.Module) -> Any:
        self.no_sync_entered.append(model)
        yield

    def reduce(self, tensor: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        self.reductions += 1
        return tensor * self.num_processes if reduction == "sum" else tensor.clone()


def test_grad_sync_switches_fsdp2_off_and_back_also_on_error() -> None:
    model = FakeFSDP2()
    with grad_sync(model, False):
        assert model.calls == [False]
    with pytest.raises(KeyError), grad_sync(model, False):
        raise KeyError
    with grad_sync(model, True):
        pass
    assert model.calls == [False, True, False, True]


def test_grad_sync_leaves_a_plain_module_alone() -> None:
    model = torch.nn.Linear(2, 1)
    with grad_sync(model, False):
        model(torch.ones(1, 2)).sum().backward()
    assert model.weight.grad is not None


def test_grad_sync_with_accelerate_sets_sync_gradients_like_accumulate() -> None:
    model = torch.nn.Linear(1, 1)
    accelerator = FakeAccelerator()
    with grad_sync(model, False, accelerator=accelerator):
        assert accelerator.sync_gradients is False
    # Kept after the block, so an optimizer.step() there is skipped, as inside `accumulate`.
    assert accelerator.sync_gradients is False
    assert accelerator.no_sync_entered == [model]
    with grad_sync(model, True, accelerator=accelerator):
        assert accelerator.sync_gradients is True
    assert accelerator.no_sync_entered == [model]
    with pytest.raises(ValueError), grad_sync(model, False, accelerator=accelerator):
        raise ValueError
    assert accelerator.sync_gradients is True


@pytest.mark.parametrize(("use_distributed", "sync_each_batch", "skips"), [(True, True, False), (False, True, True)])
def test_grad_sync_honours_sync_each_batch_only_when_distributed(
    use_distributed: bool, sync_each_batch: bool, skips: bool
) -> None:
    accelerator = FakeAccelerator(use_distributed=use_distributed, sync_each_batch=sync_each_batch)
    with grad_sync(torch.nn.Linear(1, 1), False, accelerator=accelerator):
        pass
    assert bool(accelerator.no_sync_entered) is skips
    assert accelerator.sync_gradients is False


def _loss_and_batch(lengths: list[int], width: int = 4) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    labels = torch.tensor([[1] * n + [IGNORE] * (width - n) for n in lengths])
    logits = torch.zeros(len(lengths), width, 3, dtype=torch.float64, requires_grad=True)
    return logits, {"labels": labels}


def test_scale_mean_of_a_fully_padded_micro_batch_is_a_connected_zero() -> None:
    logits, padded = _loss_and_batch([0, 0])
    _, full = _loss_and_batch([2, 3])
    window = TokenLossWindow([padded, full], model=torch.nn.Identity())
    loss_mean = F.cross_entropy(logits.reshape(-1, 3), padded["labels"].reshape(-1), ignore_index=IGNORE)
    assert loss_mean.isnan()
    scaled = window.scale_mean(loss_mean, padded)
    assert scaled.item() == 0 and scaled.grad_fn is not None
    scaled.backward()
    assert logits.grad is not None and torch.equal(logits.grad, torch.zeros_like(logits))


def test_scale_factors_use_the_accelerator_divisor_and_world_size() -> None:
    _, batch = _loss_and_batch([2, 3])
    accelerator = FakeAccelerator(steps=4)
    window = TokenLossWindow([batch, batch], accelerator=accelerator, model=torch.nn.Identity())
    assert window.num_items.item() == 10 * 3 and window.world_size == 3 and window.grad_divisor == 4
    one = torch.tensor(1.0, dtype=torch.float64)
    assert window.scale_sum(one).item() == pytest.approx(4 * 3 / 30)
    assert window.scale_mean(one, batch).item() == pytest.approx(5 * 4 * 3 / 30)
    assert accelerator.reductions == 1  # one all-reduce per window, none per micro-batch
    override = TokenLossWindow([batch], accelerator=accelerator, model=torch.nn.Identity(), dp_world_size=1)
    assert override.world_size == 1 and override.scale_sum(one).item() == pytest.approx(4 / 15)
    assert TokenLossWindow([batch], shifted=True).num_items.item() == 3


def test_a_window_without_tokens_scales_to_zero() -> None:
    _, batch = _loss_and_batch([0])
    window = TokenLossWindow([batch])
    assert window.scale_sum(torch.tensor(0.0)).item() == 0


def test_token_loss_window_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="at least one"):
        TokenLossWindow([])
    with pytest.raises(ValueError, match="model"):
        TokenLossWindow([torch.tensor([1])]).sync(0)


@settings(max_examples=25, deadline=None)
@given(token_loss_cases(world_size=1, setups=("plain",)))
def test_token_loss_window_without_a_process_group(case: selftest.TokenLossCase) -> None:
    verdict = selftest.check_token_loss(selftest.local_context(), case)
    assert verdict.status == "PASS", f"{verdict.line()}\n{case}"
    assert verdict.metrics["max_error"] <= 1e-9


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_token_loss_window_with_a_single_process_accelerator(reduction: str) -> None:
    case = selftest.TokenLossCase("accelerate", 3, selftest.canonical_lengths(1), reduction, shifted=True)
    verdict = selftest.check_token_loss(selftest.local_context(), case)
    assert verdict.status == "PASS" and verdict.setup.startswith("accelerate NO"), verdict.line()


@pytest.mark.parametrize("recipe", list(selftest.WRONG_RECIPES))
def test_the_wrong_recipes_are_detectable_in_one_process(recipe: str) -> None:
    case = selftest.TokenLossCase("plain", 3, selftest.canonical_lengths(1), recipe=recipe)
    verdict = selftest.check_token_loss(selftest.local_context(), case)
    wrong = recipe in selftest.wrong_recipes_expected_to_differ(case)
    assert (verdict.status == "FAIL") is wrong, verdict.line()


class Epochs:
    """Anything with set_epoch; records the calls."""

    def __init__(self) -> None:
        self.epochs: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)


def test_set_epoch_reaches_every_distinct_object_once() -> None:
    sampler, dataset, loader_hook, batch_sampler = Epochs(), Epochs(), Epochs(), Epochs()
    batch_sampler.sampler = sampler
    loader = SimpleNamespace(
        set_epoch=loader_hook.set_epoch, sampler=sampler, batch_sampler=batch_sampler, dataset=dataset
    )
    set_epoch(loader, 3)
    assert sampler.epochs == [3] and dataset.epochs == [3] and loader_hook.epochs == [3]
    assert batch_sampler.epochs == [3]


def test_set_epoch_takes_a_sampler_and_ignores_objects_without_it() -> None:
    sampler = Epochs()
    set_epoch(sampler, 1)
    set_epoch(SimpleNamespace(sampler=None, batch_sampler=SimpleNamespace(sampler=object()), dataset=[1]), 2)
    assert sampler.epochs == [1]


def test_set_epoch_on_a_real_loader_moves_the_distributed_sampler() -> None:
    from torch.utils.data import DataLoader, DistributedSampler

    data = list(range(8))
    loader = DataLoader(data, sampler=DistributedSampler(data, num_replicas=2, rank=1, seed=0), batch_size=2)
    first = [int(i) for batch in loader for i in batch]
    set_epoch(loader, 5)
    assert loader.sampler.epoch == 5 and [int(i) for batch in loader for i in batch] != first


@pytest.mark.parametrize(
    ("split_batches", "with_optimizer", "expected"), [(False, True, 40), (True, True, 10), (False, False, 10)]
)
def test_scheduler_total_steps(split_batches: bool, with_optimizer: bool, expected: int) -> None:
    accelerator = SimpleNamespace(
        split_batches=split_batches, step_scheduler_with_optimizer=with_optimizer, num_processes=4
    )
    assert scheduler_total_steps(10, accelerator) == expected


def _fake_deepspeed(monkeypatch: pytest.MonkeyPatch, get_group: Any) -> None:
    groups = types.ModuleType("deepspeed.utils.groups")
    groups._get_sequence_parallel_group = get_group
    utils = types.ModuleType("deepspeed.utils")
    utils.groups = groups
    deepspeed = types.ModuleType("deepspeed")
    deepspeed.utils = utils
    monkeypatch.setitem(sys.modules, "deepspeed", deepspeed)
    monkeypatch.setitem(sys.modules, "deepspeed.utils", utils)
    monkeypatch.setitem(sys.modules, "deepspeed.utils.groups", groups)
    monkeypatch.setattr(lintdist.runtime.process, "is_distributed", lambda: True)


class FakeMesh:
    mesh_dim_names = ("dp_shard", "sp")

    def __getitem__(self, name: str) -> Any:
        return SimpleNamespace(get_group=lambda: f"mesh-{name}-group")


def test_sequence_parallel_group_prefers_deepspeed(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_deepspeed(monkeypatch, lambda: "deepspeed-sp-group")
    assert sequence_parallel_group(SimpleNamespace(torch_device_mesh=FakeMesh())) == "deepspeed-sp-group"


def test_sequence_parallel_group_falls_back_to_the_mesh(monkeypatch: pytest.MonkeyPatch) -> None:
    def uninitialised() -> None:
        raise KeyError("No sequence parallel group found")

    _fake_deepspeed(monkeypatch, uninitialised)
    assert sequence_parallel_group(SimpleNamespace(torch_device_mesh=FakeMesh())) == "mesh-sp-group"
    with pytest.raises(ValueError, match="no sequence-parallel group"):
        sequence_parallel_group(SimpleNamespace(torch_device_mesh=None))


def test_sequence_parallel_group_without_deepspeed_or_a_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "deepspeed", None)
    monkeypatch.setattr(lintdist.runtime.process, "is_distributed", lambda: True)
    assert sequence_parallel_group(SimpleNamespace(torch_device_mesh=FakeMesh())) == "mesh-sp-group"
    monkeypatch.undo()
    _fake_deepspeed(monkeypatch, lambda: "deepspeed-sp-group")
    monkeypatch.setattr(lintdist.runtime.process, "is_distributed", lambda: False)
    assert sequence_parallel_group(SimpleNamespace(torch_device_mesh=FakeMesh())) == "mesh-sp-group"


def test_docstring_examples_run() -> None:
    result = doctest.testmod(lintdist.runtime.tokens, extraglobs={"torch": torch})
    assert result.attempted >= 3 and result.failed == 0


def test_public_helpers_have_docstrings_with_examples() -> None:
    for name in lintdist.runtime.__all__:
        doc = getattr(lintdist.runtime, name).__doc__ or ""
        assert "Example" in doc, name


def test_importing_the_runtime_pulls_in_no_linter_and_no_optional_framework() -> None:
    code = (
        "import sys, lintdist.runtime\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'accelerate', 'transformers', 'deepspeed'}\n"
        "             or (m.startswith('lintdist.') and not m.startswith('lintdist.runtime')))\n"
        "print(bad)\n"
    )
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert output.strip() == "[]"


def test_report_exits_non_zero_on_any_failure(capsys: pytest.CaptureFixture[str]) -> None:
    passing = selftest.Verdict("any-rank", "W=2", "PASS", "ok")
    failing = selftest.Verdict("token-loss", "raw DDP, W=2, G=3", "FAIL", "max |grad - ref| = 1.0e-01")
    assert selftest.report([passing, selftest.Verdict("x", "y", "SKIP", "n/a")]) == 0
    assert selftest.report([passing, failing]) == 1
    out = capsys.readouterr().out
    assert "FAIL token-loss (raw DDP, W=2, G=3): max |grad - ref| = 1.0e-01" in out
    assert out.strip().endswith("FAIL: 1/2 checks passed")


def _labelled(counts: list[int], width: int = 4) -> list[dict[str, torch.Tensor]]:
    """One batch per count: a row with that many loss tokens, padded with -100."""
    return [{"labels": torch.tensor([[1] * n + [IGNORE] * (width - n)])} for n in counts]


def _prepared(batches: int, accumulation: int = 3) -> tuple[Any, Any]:
    """A one-process CPU Accelerator and a prepared loader of `batches` padded batches."""
    pytest.importorskip("accelerate")
    from torch.utils.data import DataLoader

    accelerator = selftest._accelerator(selftest.local_context(), accumulation)
    examples = selftest.token_windows_examples(1, batches)
    loader = DataLoader(examples, batch_size=selftest.TOKEN_WINDOWS_BATCH_SIZE, collate_fn=selftest.pad_collate)
    return accelerator, accelerator.prepare(loader)


def test_token_windows_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="steps="):
        TokenWindows([])
    with pytest.raises(ValueError, match="at least 1"):
        TokenWindows([], steps=0)
    token_windows = TokenWindows(_labelled([1]), steps=2)
    one = torch.tensor(1.0)
    with pytest.raises(RuntimeError, match="inside the loop"):
        token_windows.scale_mean(one, _labelled([1])[0])
    with pytest.raises(RuntimeError, match="inside the loop"):
        token_windows.scale_sum(one)
    with pytest.raises(RuntimeError, match="once the loop has started"):
        token_windows.num_items  # noqa: B018


@pytest.mark.parametrize("count", [0, 1, 5, 6, 7])
def test_token_windows_without_an_accelerator_cut_steps_from_the_start_of_each_pass(count: int) -> None:
    counts = [(3 * i) % 5 for i in range(count)]
    batches = _labelled(counts)
    token_windows = TokenWindows(batches, steps=3)
    assert len(token_windows) == count
    for _ in range(2):  # a second pass starts its windows afresh
        seen, sizes, totals = [], [], []
        for i, batch in enumerate(token_windows):
            seen.append(batch)
            if i % 3 == 0:
                sizes.append(len(token_windows.window.micro_batches))
                totals.append(int(token_windows.num_items))
            assert token_windows.window.micro_batches[i % 3] is batch
        assert len(seen) == count and all(a is b for a, b in zip(seen, batches))
        assert sizes == [len(counts[start : start + 3]) for start in range(0, count, 3)]
        assert totals == [sum(counts[start : start + 3]) for start in range(0, count, 3)]
        assert token_windows.end_of_dataloader is False


def test_token_windows_reads_one_window_ahead_of_the_consumer() -> None:
    read: list[int] = []

    def loader() -> Any:
        for i, batch in enumerate(_labelled([1, 2, 3, 4, 5])):
            read.append(i)
            yield batch

    token_windows = TokenWindows(loader(), steps=2)
    iterator = iter(token_windows)
    next(iterator)
    assert read == [0, 1]
    next(iterator)
    assert read == [0, 1]
    next(iterator)
    assert read == [0, 1, 2, 3]


def test_token_windows_scale_a_batch_of_the_previous_window_by_its_own_window() -> None:
    # A consumer that reads one batch ahead (Lightning's fetcher) scales batch i after fetching batch i + 1.
    counts = [1, 3, 4, 1, 6]
    window_of = [0, 0, 1, 1, 2]
    tokens = [4, 5, 6]
    token_windows = TokenWindows(_labelled(counts), steps=2, grad_divisor=2)
    one = torch.tensor(1.0, dtype=torch.float64)
    iterator = iter(token_windows)
    previous, index = next(iterator), 0
    while previous is not None:
        current = next(iterator, None)
        if current is not None and index % 2 == 1:
            # The wrapper has read the next window; `previous` is the last batch of the one before.
            assert int(token_windows.num_items) == tokens[window_of[index] + 1]
        n = tokens[window_of[index]]
        assert token_windows.scale_mean(one, previous).item() == pytest.approx(counts[index] * 2 / n)
        assert token_windows.scale_sum(one, previous).item() == pytest.approx(2 / n)
        previous, index = current, index + 1
    assert index == len(counts)
    # Without the batch, scale_sum uses the window read last.
    assert token_windows.scale_sum(one).item() == pytest.approx(2 / 6)


def test_token_windows_with_a_prepared_loader_follow_accelerate_syncs() -> None:
    accelerator, loader = _prepared(7)
    model = torch.nn.Linear(1, 1)
    token_windows = TokenWindows(loader, accelerator=accelerator, shifted=True)
    assert len(token_windows) == len(loader) == 7
    state = accelerator.gradient_state
    rows = []
    for batch in token_windows:
        assert state.active_dataloader is token_windows
        with accelerator.accumulate(model):
            window = token_windows.window
            rows.append((len(window.micro_batches), state.end_of_dataloader, accelerator.sync_gradients))
            assert any(item is batch for item in window.micro_batches)
            assert int(token_windows.num_items) == int(count_loss_tokens(window.micro_batches, shifted=True))
    assert rows == [
        (3, False, False),
        (3, False, False),
        (3, False, True),
        (3, False, False),
        (3, False, False),
        (3, False, True),
        (1, True, True),
    ]
    assert not state.in_dataloader and token_windows not in state.dataloader_references
    assert token_windows.end_of_dataloader is False


@pytest.mark.parametrize("batches", [6, 7])
def test_token_windows_say_end_of_dataloader_only_at_the_last_batch(batches: int) -> None:
    accelerator, loader = _prepared(batches)
    token_windows = TokenWindows(loader, accelerator=accelerator)
    state = accelerator.gradient_state
    model = torch.nn.Linear(1, 1)
    for epoch in range(3):
        ends = []
        for _ in token_windows:
            ends.append(state.end_of_dataloader)
            with accelerator.accumulate(model):
                pass
        assert ends == [False] * (batches - 1) + [True]
        # The loader ran to its end: it counted the epoch and left the gradient state.
        assert loader.iteration == epoch + 1
        assert not state.in_dataloader and state.end_of_dataloader is False
        assert accelerator.step == 0


def test_token_windows_follow_accelerator_step_after_skip_first_batches() -> None:
    accelerator, loader = _prepared(7)
    model = torch.nn.Linear(1, 1)
    # What load_state restores from a checkpoint saved after 2 micro-batches of a window.
    accelerator.step = 2
    token_windows = TokenWindows(accelerator.skip_first_batches(loader, 2), accelerator=accelerator)
    sizes, syncs = [], []
    for _ in token_windows:
        with accelerator.accumulate(model):
            sizes.append(len(token_windows.window.micro_batches))
            syncs.append(accelerator.sync_gradients)
    assert sizes == [1, 3, 3, 3, 1]
    assert syncs == [True, False, False, True, True]


def test_a_break_mid_epoch_leaves_the_wrapper_unregistered() -> None:
    accelerator, loader = _prepared(7)
    state = accelerator.gradient_state
    token_windows = TokenWindows(loader, accelerator=accelerator)
    for i, _ in enumerate(token_windows):
        assert state.active_dataloader is token_windows
        if i == 4:
            break
    assert token_windows not in state.dataloader_references
    # As after a break out of the bare loader: accelerate's loader itself stays registered until its next pass.
    assert state.active_dataloader is loader and state.end_of_dataloader is False
    assert token_windows.end_of_dataloader is False
    assert len(list(token_windows)) == 7
    assert not state.in_dataloader and loader.iteration == 1


@pytest.mark.parametrize("stop", [3, 5, 6, 7])
def test_after_a_break_accelerate_sees_what_it_sees_without_the_wrapper(stop: int) -> None:
    # 15 examples in batches of 2: 8 batches (windows 3, 3, 2), the last one short (remainder 1).
    pytest.importorskip("accelerate")
    from torch.utils.data import DataLoader

    seen = []
    for wrap in (False, True):
        accelerator = selftest._accelerator(selftest.local_context(), 3)
        examples = selftest.token_windows_examples(1, 8)[:15]
        loader = accelerator.prepare(DataLoader(examples, batch_size=2, collate_fn=selftest.pad_collate))
        model = torch.nn.Linear(1, 1)
        source = TokenWindows(loader, accelerator=accelerator) if wrap else loader
        for i, _ in enumerate(source):
            with accelerator.accumulate(model):
                pass
            if i == stop:
                break
        state = accelerator.gradient_state
        # What statements after the loop read: gather_for_metrics truncates to `remainder` at a loader's end.
        after = [state.in_dataloader, state.end_of_dataloader, state.remainder, accelerator.step]
        after.append(accelerator.gather_for_metrics(torch.arange(4)).tolist())
        with accelerator.accumulate(model):
            after.append(accelerator.sync_gradients)
        after += [len(list(source)), state.in_dataloader, loader.iteration]
        seen.append(after)
    assert seen[1] == seen[0]
    assert seen[0][1] is (stop == 7)


def test_token_windows_warn_when_accelerate_does_not_sync_with_the_dataloader() -> None:
    pytest.importorskip("accelerate")
    from accelerate import Accelerator
    from accelerate.utils import GradientAccumulationPlugin

    plugin = GradientAccumulationPlugin(num_steps=3, sync_with_dataloader=False)
    accelerator = Accelerator(cpu=True, gradient_accumulation_plugin=plugin)
    try:
        loader = accelerator.prepare(torch.utils.data.DataLoader(_labelled([1, 2]), batch_size=None))
        with pytest.warns(UserWarning, match="sync_with_dataloader=False"):
            assert len(list(TokenWindows(loader, accelerator=accelerator))) == 2
    finally:
        selftest._accelerator(selftest.local_context(), 1)  # restore accelerate's default plugin


@pytest.mark.parametrize(
    ("setup", "options"),
    [
        ("accelerate", {}),
        ("accelerate", {"reduction": "sum", "shifted": False}),
        ("accelerate", {"iterable": True}),
        ("ddp", {}),
        ("ddp", {"grad_divisor": 3}),
    ],
)
def test_token_windows_check_in_one_process(setup: str, options: dict[str, Any]) -> None:
    if setup == "accelerate":
        pytest.importorskip("accelerate")
    verdict = selftest.check_token_windows(selftest.local_context(), setup, **options)
    assert verdict.status == "PASS", verdict.line()
    assert verdict.metrics["max_error"] <= 1e-9
    assert verdict.metrics["steps"] == verdict.metrics["steps_without_wrapper"] == 6
    if setup == "accelerate":
        assert verdict.metrics["resume_steps"] == verdict.metrics["resume_steps_without_wrapper"] == 5
        assert verdict.metrics["resume_mid_window_steps"] == 6


def test_token_windows_report_each_batch_s_remainder_as_the_dispatching_loader_did() -> None:
    # DataLoaderDispatcher (an IterableDataset) sets `remainder` while yielding its last batch: read a window
    # ahead, the wrapper must still report it at that batch only.
    pytest.importorskip("accelerate")
    from torch.utils.data import DataLoader

    accelerator = selftest._accelerator(selftest.local_context(), 3)
    examples = selftest.token_windows_examples(1, 6)
    collate = functools.partial(selftest.pad_collate, width=7)
    loader = accelerator.prepare(DataLoader(selftest._Stream(examples), batch_size=2, collate_fn=collate))
    assert type(loader).__name__ == "DataLoaderDispatcher"
    model = torch.nn.Linear(1, 1)
    state = accelerator.gradient_state
    traces = []
    for source in (loader, TokenWindows(loader, accelerator=accelerator)):
        trace = []
        for _ in source:
            with accelerator.accumulate(model):
                trace.append((state.remainder, state.end_of_dataloader, accelerator.sync_gradients))
        traces.append(trace)
    assert traces[0] == traces[1]
    assert [remainder for remainder, _, _ in traces[1]] == [-1] * 5 + [2]
