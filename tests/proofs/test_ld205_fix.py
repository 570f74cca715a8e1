"""LD205 proven by running it: the skipping loader drops the resumed batches in every later epoch too; after
--unsafe-fixes only the resumed epoch is short."""

from __future__ import annotations

import pytest

from tests.proofs.harness import fixed_copy, run_ranks

pytestmark = pytest.mark.slow


def test_only_the_resumed_epoch_skips(tmp_path):
    broken, fixed = fixed_copy("ld205_resume_skip.py", tmp_path, codes="LD205", unsafe=True)
    assert "for x, y in active_dataloader:" in fixed.read_text()

    # 32 samples, batches of 4, 2 ranks: 4 batches per rank and epoch, 2 of them skipped on resuming.
    broken_ranks = run_ranks(broken, tmp_path / "out-broken")
    assert [report["world"] for report in broken_ranks] == [2, 2]
    assert all(report["batches"] == [2, 2, 2] for report in broken_ranks)

    fixed_ranks = run_ranks(fixed, tmp_path / "out-fixed")
    assert all(report["batches"] == [2, 4, 4] for report in fixed_ranks)
