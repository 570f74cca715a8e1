"""LD402 proven by running it: a rank-local early stop leaves the other rank hanging at the next collective
(caught by a short process-group timeout); after --fix every rank stops at the same step."""

from __future__ import annotations

import json
import os
import sys

import pytest

from tests.proofs import harness
from tests.proofs.harness import fixed_copy, run_ranks

pytestmark = pytest.mark.slow

# The scripts' process group times out after 6 s; a broken launch has failed well before this.
BROKEN_TIMEOUT_S = 60


def _broken_launch(script, out_dir, monkeypatch) -> tuple[int | None, str, dict[int, dict]]:
    """Run ``script`` on 2 gloo ranks expecting it to fail or hang: (return code or None if killed, output,
    reports)."""
    out_dir.mkdir(parents=True)
    env = {
        **os.environ,
        "PROOF_OUT": str(out_dir),
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONFAULTHANDLER": "1",
    }
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    monkeypatch.setattr(harness, "RUN_TIMEOUT_S", BROKEN_TIMEOUT_S)
    returncode, output = harness._launch(command, env, script.parent, out_dir / "launch.log")
    reports = {
        rank: json.loads((out_dir / f"rank{rank}.json").read_text())
        for rank in range(2)
        if (out_dir / f"rank{rank}.json").exists()
    }
    return returncode, output, reports


@pytest.mark.parametrize(
    ("name", "spelling"),
    [
        (
            "ld402_accelerate_stop.py",
            (
                "    if val_loss < TARGET:\n        accelerator.set_trigger()\n"
                "    if accelerator.check_trigger():\n        break\n"
            ),
        ),
        ("ld402_raw_stop.py", "    if any_rank(val_loss < TARGET):\n        break\n"),
    ],
)
def test_fixed_script_stops_every_rank_at_the_same_step(tmp_path, monkeypatch, name, spelling):
    broken, fixed = fixed_copy(name, tmp_path, codes="LD402")
    assert spelling in fixed.read_text()

    # Broken: rank 0 stops at step 5 and waits at the closing barrier; rank 1 goes on to the next backward's
    # all-reduce, which rank 0 never joins. The launch fails (process-group timeout) instead of finishing.
    returncode, output, reports = _broken_launch(broken, tmp_path / "out-broken", monkeypatch)
    assert returncode != 0, "the broken script must not finish cleanly"
    assert "Timed out" in output, f"the ranks must have waited for each other until the timeout:\n{output[-4000:]}"
    assert reports.get(0) == {"stopped_at": 5}
    assert 1 not in reports, "rank 1 must never reach the end of its loop"

    # Fixed: rank 0's condition stops both ranks at step 5, and the launch ends.
    ranks = run_ranks(fixed, tmp_path / "out-fixed")
    assert [report["stopped_at"] for report in ranks] == [5, 5]
