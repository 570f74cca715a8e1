"""LD503 proven by running it: on 2 gloo ranks (accelerate MULTI_CPU under torchrun), a linear decay sized in
optimizer steps and passed to `accelerator.prepare` reaches lr 0 after half the optimizer steps; after
`--fix --unsafe-fixes` it reaches 0 exactly at the last optimizer step and follows the schedule the script meant
(warmup included) at every step.

The module also checks LD503's opt-in fixtures (``fixtures/ld503/<shape>.unsafe.fixed.py``) through the CLI, and
LD502's opt-in expectations (``fixtures/ld502/<shape>.ld502.expected``): these are fast, not slow."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import libcst as cst
import pytest

from tests.proofs.harness import fixed_copy, run_ranks

FIXTURES = Path(__file__).resolve().parent.parent.parent / "fixtures"
SCRIPT = "ld503_linear_decay.py"
WARMUP = 2
BASE_LR = 0.1


def _intended(step: int, planned: int) -> float:
    """The script's schedule after ``step`` optimizer steps, as one process would run it."""
    if step < WARMUP:
        return BASE_LR * step / WARMUP
    return BASE_LR * max(0.0, (planned - step) / (planned - WARMUP))


def _first_zero(lrs: list[float]) -> int:
    """The optimizer step (1-based) after which the learning rate is 0 for the first time."""
    return next(index + 1 for index, lr in enumerate(lrs) if lr == 0.0)


@pytest.mark.slow
def test_fixed_schedule_ends_at_the_last_optimizer_step(tmp_path):
    broken, fixed = fixed_copy(SCRIPT, tmp_path, codes="LD503", unsafe=True)
    text = fixed.read_text()
    assert "from lintdist.runtime import scheduler_total_steps" in text
    assert "num_training_steps=scheduler_total_steps(total_steps, accelerator)" in text
    assert "num_warmup_steps=scheduler_total_steps(WARMUP, accelerator)" in text

    broken_ranks = run_ranks(broken, tmp_path / "out-broken")
    fixed_ranks = run_ranks(fixed, tmp_path / "out-fixed")

    for report in broken_ranks + fixed_ranks:
        assert report["num_processes"] == 2
        assert report["distributed_type"] == "MULTI_CPU"
        assert report["planned_steps"] == 16  # 64 samples, batch 4, 2 ranks, 2 epochs
        assert len(report["lrs"]) == report["planned_steps"]

    for report in broken_ranks:
        lrs = report["lrs"]
        # the wrapper steps the schedule twice per optimizer step: it is over after half of training
        assert _first_zero(lrs) == len(lrs) // 2
        assert all(lr == 0.0 for lr in lrs[len(lrs) // 2 :])
        assert all(lr > 0.0 for lr in lrs[: len(lrs) // 2 - 1])
    for report in fixed_ranks:
        lrs = report["lrs"]
        assert _first_zero(lrs) == len(lrs), "the schedule must end exactly at the last optimizer step"
        assert all(lr > 0.0 for lr in lrs[:-1])
        expected = [_intended(step, report["planned_steps"]) for step in range(1, len(lrs) + 1)]
        assert lrs == pytest.approx(expected, abs=1e-12)
    assert broken_ranks[0]["lrs"] == broken_ranks[1]["lrs"]
    assert fixed_ranks[0]["lrs"] == fixed_ranks[1]["lrs"]


LD503_FIXABLE = sorted(
    p
    for p in (FIXTURES / "ld503").rglob("*.py")
    if ".fixed." not in p.name and p.with_name(p.stem + ".unsafe.fixed.py").exists()
)


@pytest.mark.parametrize("source", LD503_FIXABLE, ids=lambda p: str(p.relative_to(FIXTURES / "ld503")))
def test_ld503_unsafe_fix_matches_and_is_stable(source, tmp_path, lintdist):
    folder = tmp_path / source.parent.name
    shutil.copytree(source.parent, folder)
    target = folder / source.name
    lintdist("check", "--fix", "--no-cache", "--select", "LD503", str(target))
    assert target.read_bytes() == source.read_bytes(), "the fix is unsafe: --fix alone must not apply it"

    lintdist("check", "--fix", "--unsafe-fixes", "--no-cache", "--select", "LD503", str(target))
    expected = source.with_name(source.stem + ".unsafe.fixed.py").read_bytes()
    assert target.read_bytes() == expected
    cst.parse_module(expected)
    after = lintdist("check", "--no-cache", "--select", "LD503", "--output-format", "json", str(target))
    assert json.loads(after.output) == []


def test_ld503_fixable_shapes_exist():
    assert len(LD503_FIXABLE) >= 6


LD502_SOURCES = (
    sorted(p for p in (FIXTURES / "ld502").rglob("*.py") if ".fixed." not in p.name)
    if (FIXTURES / "ld502").exists()
    else []
)


@pytest.mark.parametrize("source", LD502_SOURCES, ids=lambda p: str(p.relative_to(FIXTURES / "ld502")))
def test_ld502_opt_in_expectations(source, lintdist):
    result = lintdist("check", "--no-cache", "--select", "LD502", "--output-format", "json", str(source))
    found = [f"{f['line']}:{f['column']}: {f['code']}" for f in json.loads(result.output)]
    expectation = source.with_name(source.stem + ".ld502.expected")
    expected = expectation.read_text().split("\n") if expectation.exists() else []
    assert found == [line for line in expected if line.strip()]


@pytest.mark.slow
def test_two_branch_fix_scales_only_the_given_count(tmp_path):
    """The given-or-derived length: with `--max_train_steps 8` (optimizer steps) the broken schedule reaches 0 after
    4 of the 8 steps on 2 ranks, the fixed one exactly at the 8th; with the count derived from the un-sharded loader
    (16 batches x 2 epochs = 32, each rank making 16 optimizer steps) both end exactly at the last step, with the
    same learning rates: the fix leaves that branch as it was."""
    broken, fixed = fixed_copy("ld503_given_or_derived.py", tmp_path, codes="LD503", unsafe=True)
    text = fixed.read_text()
    assert "max_train_steps_for_scheduler = scheduler_total_steps(args.max_train_steps, accelerator)" in text
    assert "num_training_steps=max_train_steps_for_scheduler" in text

    given = ("--max_train_steps", "8")
    broken_given = run_ranks(broken, tmp_path / "broken-given", args=given)
    fixed_given = run_ranks(fixed, tmp_path / "fixed-given", args=given)
    broken_derived = run_ranks(broken, tmp_path / "broken-derived")
    fixed_derived = run_ranks(fixed, tmp_path / "fixed-derived")

    for report in broken_given + fixed_given:
        assert report["num_processes"] == 2 and len(report["lrs"]) == 8
    assert all(_first_zero(report["lrs"]) == 4 for report in broken_given)
    for report in fixed_given:
        assert _first_zero(report["lrs"]) == 8 and all(lr > 0.0 for lr in report["lrs"][:-1])
        assert report["lrs"] == pytest.approx([BASE_LR * (16 - 2 * step) / 16 for step in range(1, 9)], abs=1e-12)
    for broken_report, fixed_report in zip(broken_derived, fixed_derived, strict=True):
        assert len(fixed_report["lrs"]) == 16 and _first_zero(fixed_report["lrs"]) == 16
        assert fixed_report["lrs"] == broken_report["lrs"]
