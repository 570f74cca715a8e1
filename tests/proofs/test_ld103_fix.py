"""LD103 proven by running it: after --fix, raw DDP all-reduces once per accumulation window, not per micro-batch,
and the gradient at every optimizer step still equals the single-process float64 reference."""

from __future__ import annotations

import pytest

from tests.proofs.harness import fixed_copy, run_ranks

pytestmark = pytest.mark.slow

ACCUM = 3
TOLERANCE = 1e-12  # float64


def _max_difference(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for p, q in zip(a, b) for x, y in zip(p, q))


def test_fixed_loop_all_reduces_once_per_window(tmp_path):
    broken, fixed = fixed_copy("ld103_ddp_accumulation.py", tmp_path, codes="LD103")
    assert "with grad_sync(model, sync=(step + 1) % ACCUM == 0):" in fixed.read_text()

    broken_ranks = run_ranks(broken, tmp_path / "out-broken")
    fixed_ranks = run_ranks(fixed, tmp_path / "out-fixed")
    assert broken_ranks[0]["world"] == 2

    for report in broken_ranks:
        # Before: every micro-batch's backward all-reduces (one bucket for this tiny model).
        assert report["per_micro_batch"] == [1] * 9
    for report in fixed_ranks:
        # After: only the micro-batch that precedes each optimizer step does.
        assert report["per_micro_batch"] == [0, 0, 1] * 3
        assert len(report["step_grads"]) == 3
        assert _max_difference(report["step_grads"], report["reference_grads"]) < TOLERANCE
    # Same gradients as before the fix, on every rank, at every step.
    for before, after in zip(broken_ranks, fixed_ranks):
        assert _max_difference(before["step_grads"], after["step_grads"]) < TOLERANCE
    assert _max_difference(fixed_ranks[0]["step_grads"], fixed_ranks[1]["step_grads"]) == 0.0
