"""LD108 proven by running it: with the loss divided by the steps before `accelerator.backward`, the first optimizer
step's gradient is 3 times too small; after --fix deletes the division it is the window's mean."""

from __future__ import annotations

import pytest

from tests.proofs.harness import fixed_copy, run_ranks
from tests.proofs.test_ld106_fix import TOLERANCE, max_error, relative_scale, window_mean_gradient

pytestmark = pytest.mark.slow

SCRIPT = "ld108_double_division.py"


def test_double_division_shrinks_the_gradient_and_the_fix_restores_it(tmp_path):
    broken, fixed = fixed_copy(SCRIPT, tmp_path, codes="LD108")
    text = fixed.read_text()
    assert "/ args.gradient_accumulation_steps" not in text
    assert "            loss = model(x, y)\n            accelerator.backward(loss)\n" in text

    for label, path in (("broken", broken), ("fixed", fixed)):
        ranks = run_ranks(path, tmp_path / f"out-{label}")
        assert [r["num_processes"] for r in ranks] == [2, 2]
        assert [len(r["seen"]) for r in ranks] == [3, 3]  # one window of 3 micro-batches per rank
        reference = window_mean_gradient(SCRIPT, ranks)
        if label == "fixed":
            assert max(max_error(r, reference) for r in ranks) <= TOLERANCE
        else:
            assert [round(relative_scale(r, reference), 6) for r in ranks] == [round(1 / 3, 6)] * 2
