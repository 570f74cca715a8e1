"""LD202 proven by running it: with a sampler, `shuffle=True` makes DataLoader raise on every rank; the fixed
script trains under torchrun and still shuffles in a single process (the fix keeps `shuffle` for that run)."""

from __future__ import annotations

import pytest

from tests.proofs.harness import fixed_copy, run_ranks

pytestmark = pytest.mark.slow

SAMPLES = 32


def test_fixed_loader_builds_and_keeps_shuffling(tmp_path):
    broken, fixed = fixed_copy("ld202_sampler_and_shuffle.py", tmp_path, codes="LD202")
    assert "shuffle=sampler is None, sampler=sampler" in fixed.read_text()

    # Before: DataLoader refuses the pair on every rank of the distributed run.
    broken_ranks = run_ranks(broken, tmp_path / "out-broken")
    assert [report["world"] for report in broken_ranks] == [2, 2]
    assert all(report.get("error") == "sampler option is mutually exclusive with shuffle" for report in broken_ranks)

    # After: the ranks split the data, each epoch in a new order.
    fixed_ranks = run_ranks(fixed, tmp_path / "out-fixed")
    assert all("error" not in report for report in fixed_ranks)
    for epoch in range(2):
        together = sorted(v for report in fixed_ranks for v in report["orders"][epoch])
        assert together == list(range(SAMPLES))
    assert all(report["orders"][0] != report["orders"][1] for report in fixed_ranks)

    # One process, no sampler: the fixed loader still shuffles, as the original did.
    (single,) = run_ranks(fixed, tmp_path / "out-single", nproc=1)
    assert single["world"] == 1
    assert sorted(single["orders"][0]) == list(range(SAMPLES))
    assert single["orders"][0] != list(range(SAMPLES))
