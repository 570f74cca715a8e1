"""LD404 proven by running it: `gather` returns the samples accelerate repeats to fill the last eval batch;
after --fix, `gather_for_metrics` returns exactly the dataset and the metric equals the single-process one."""

from __future__ import annotations

import math

import pytest

from tests.proofs.harness import fixed_copy, run_ranks

pytestmark = pytest.mark.slow

SAMPLES = 11  # not divisible by world size (2) * batch size (3)


def test_fixed_script_gathers_each_sample_once(tmp_path):
    broken, fixed = fixed_copy("ld404_eval_duplicates.py", tmp_path, codes="LD404")
    assert fixed.read_text().count("accelerator.gather_for_metrics(") == 2

    broken_ranks = run_ranks(broken, tmp_path / "out-broken")
    fixed_ranks = run_ranks(fixed, tmp_path / "out-fixed")

    for report in broken_ranks:
        assert report["world"] == 2
        # 2 ranks x 2 batches x 3 rows: the 12th row is sample 0 again, so the metric counts it twice
        assert report["count"] == 12
        assert report["ids"] == sorted([*range(SAMPLES), 0])
        assert not math.isclose(report["metric"], report["expected"], rel_tol=1e-9)
    for report in fixed_ranks:
        assert report["count"] == SAMPLES
        assert report["ids"] == list(range(SAMPLES))
        assert math.isclose(report["metric"], report["expected"], rel_tol=1e-12, abs_tol=1e-12)
