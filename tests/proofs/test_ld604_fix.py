"""LD604 proven by running it: the old DCP functions given `checkpoint_id=` raise TypeError on every rank; after
--fix (`dcp.save`/`dcp.load`) the checkpoint round-trips on 2 gloo ranks."""

from __future__ import annotations

import pytest

from tests.proofs.harness import fixed_copy, run_ranks

pytestmark = pytest.mark.slow


def test_fixed_calls_save_and_reload_the_checkpoint(tmp_path):
    broken, fixed = fixed_copy("ld604_checkpoint_id.py", tmp_path, codes="LD604")
    text = fixed.read_text()
    assert "dcp.save(saved, checkpoint_id=path)" in text and "dcp.load(restored, checkpoint_id=path)" in text

    assert [report["error"] for report in run_ranks(broken, tmp_path / "out-broken")] == ["TypeError"] * 2
    for report in run_ranks(fixed, tmp_path / "out-fixed"):
        assert report == {"error": None, "equal": True}
