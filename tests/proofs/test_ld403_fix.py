"""LD403 proven by running it: rank 0 writes a checkpoint slowly and every rank loads it. Before the fix rank 1
reads before the file exists; after it, every rank waits at the inserted barrier and loads the same tensors."""

from __future__ import annotations

import pytest

from tests.proofs.harness import fixed_copy, run_ranks

pytestmark = pytest.mark.slow


def test_fixed_script_loads_the_checkpoint_on_every_rank(tmp_path):
    broken, fixed = fixed_copy("ld403_rank0_checkpoint.py", tmp_path, codes="LD403")
    text = fixed.read_text()
    assert '        torch.save({"weights": weights}, checkpoint)\n    try:\n        dist.barrier()\n' in text

    before = run_ranks(broken, tmp_path / "out-broken")
    # rank 0 loads the file it wrote; rank 1 got there first and found nothing
    assert before[0]["error"] is None and before[0]["loaded"] == before[0]["expected"]
    assert before[1]["error"] == "FileNotFoundError" and before[1]["loaded"] is None

    after = run_ranks(fixed, tmp_path / "out-fixed")
    for report in after:
        assert report["error"] is None
        assert report["loaded"] == after[0]["expected"]
