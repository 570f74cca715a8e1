"""LD605 proven by running it: resuming FSDP1 with a discarded `FSDP.optim_state_dict_to_load(...)` leaves the
fresh Adam optimizer without state; after --fix the saved `exp_avg` is restored on every rank."""

from __future__ import annotations

import pytest

from tests.proofs.harness import fixed_copy, run_ranks

pytestmark = pytest.mark.slow


def test_fixed_resume_restores_the_optimizer_state(tmp_path):
    broken, fixed = fixed_copy("ld605_resume_optimizer.py", tmp_path, codes="LD605")
    assert "    optim.load_state_dict(FSDP.optim_state_dict_to_load(model, optim, osd))\n" in fixed.read_text()

    for report in run_ranks(broken, tmp_path / "out-broken"):
        assert report["saved"], "the first run must have Adam state to save"
        assert report["state_entries"] == 0 and report["resumed"] == []

    for report in run_ranks(fixed, tmp_path / "out-fixed"):
        assert report["state_entries"] == len(report["saved"]) > 0
        assert report["resumed"] == report["saved"]
