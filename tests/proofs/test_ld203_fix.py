"""LD203 proven by running it: without a sampler both ranks train on all 32 samples every epoch; after
--fix --unsafe-fixes they split them into disjoint halves, with a new order each epoch (the fix's set_epoch)."""

from __future__ import annotations

import pytest

from tests.proofs.harness import fixed_copy, run_ranks

pytestmark = pytest.mark.slow

SAMPLES = 32


def test_fixed_loader_gives_each_rank_its_own_half(tmp_path):
    broken, fixed = fixed_copy("ld203_full_copies.py", tmp_path, codes="LD203", unsafe=True)
    text = fixed.read_text()
    assert "sampler=DistributedSampler(dataset, shuffle=True)" in text
    assert "loader.sampler.set_epoch(epoch)" in text

    broken_ranks = run_ranks(broken, tmp_path / "out-broken")
    fixed_ranks = run_ranks(fixed, tmp_path / "out-fixed")
    world = broken_ranks[0]["world"]
    assert world == 2

    for epoch in range(3):
        # Before: every rank reads every sample, so the job trains on W copies of the data.
        assert all(sorted(r["orders"][epoch]) == list(range(SAMPLES)) for r in broken_ranks)
        # After: each rank reads its own 1/W, and together the ranks cover the dataset exactly once.
        halves = [set(r["orders"][epoch]) for r in fixed_ranks]
        assert all(len(half) == SAMPLES // world for half in halves)
        assert halves[0].isdisjoint(halves[1])
        assert sorted(v for r in fixed_ranks for v in r["orders"][epoch]) == list(range(SAMPLES))
    for report in fixed_ranks:
        assert len({tuple(order) for order in report["orders"]}) == 3, "set_epoch gives each epoch a new order"
