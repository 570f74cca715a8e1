"""LD409 proven by running it: rank 0 evaluating a DDP model with a BatchNorm buffer under `no_grad` waits in
DDP's buffer broadcast for a rank that never comes (caught by a short process-group timeout); after the unsafe
--fix (`model.module(...)`) the launch ends."""

from __future__ import annotations

import pytest

from tests.proofs.harness import fixed_copy, run_ranks
from tests.proofs.test_ld402_fix import _broken_launch

pytestmark = pytest.mark.slow


def test_rank0_evaluation_with_inner_module_finishes(tmp_path, monkeypatch):
    broken, fixed = fixed_copy("ld409_rank0_eval.py", tmp_path, codes="LD409", unsafe=True)
    assert "model.module(torch.randn(8, 4))" in fixed.read_text()

    # Broken: rank 0 waits in the buffer broadcast inside the forward, rank 1 at the barrier: both time out, and
    # rank 0 never writes its report.
    returncode, output, reports = _broken_launch(broken, tmp_path / "out-broken", monkeypatch)
    assert returncode != 0, "the rank-0 evaluation must not finish cleanly"
    assert "Timed out" in output, f"the ranks must have waited for each other until the timeout:\n{output[-4000:]}"
    assert 0 not in reports, "rank 0 must never finish its evaluation"

    # Fixed: rank 0 evaluates its own copy of the module, without a collective, and both ranks pass the barrier.
    ranks = run_ranks(fixed, tmp_path / "out-fixed")
    assert "val" in ranks[0] and "val" not in ranks[1]
