"""LD110 proven by running it: under accelerate MULTI_CPU (DDP), `accelerator.no_sync(model)` from --fix skips the
same all-reduces as the prepared model's own `no_sync()` did and gives the same gradients at every step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.proofs.harness import fixed_copy, run_ranks

pytestmark = pytest.mark.slow

ACCUM = 3


def _max_difference(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b))


def test_accelerator_no_sync_matches_model_no_sync(tmp_path):
    broken, fixed = fixed_copy("ld110_model_no_sync.py", tmp_path, codes="LD110")
    text = fixed.read_text()
    assert "with accelerator.no_sync(model):" in text
    assert "model.no_sync()" not in text

    broken_ranks = run_ranks(broken, tmp_path / "out-broken")
    fixed_ranks = run_ranks(fixed, tmp_path / "out-fixed")
    assert fixed_ranks[0]["world"] == 2
    assert fixed_ranks[0]["distributed_type"].endswith("MULTI_CPU")

    for ranks in (broken_ranks, fixed_ranks):
        first, second = ranks
        for index, (a, b) in enumerate(zip(first["micro_grads"], second["micro_grads"])):
            if (index + 1) % ACCUM:
                # under no_sync: each rank holds only its own micro-batches' gradient
                assert _max_difference(a, b) > 1e-6, f"micro-batch {index} was synchronized"
            else:
                assert _max_difference(a, b) == 0.0, f"micro-batch {index} (the step's) was not synchronized"
    # The fix changes nothing for DDP: identical gradients at every step, on every rank.
    for before, after in zip(broken_ranks, fixed_ranks):
        assert len(after["step_grads"]) == 3
        for a, b in zip(before["step_grads"], after["step_grads"]):
            assert a == b


def _run_single(script: Path, out_dir: Path) -> subprocess.CompletedProcess:
    """``python script`` with no launcher: one process, no process group."""
    out_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PROOF_OUT": str(out_dir), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return subprocess.run(  # noqa: PLW1510 - the return code is asserted by the caller
        [sys.executable, str(script)], env=env, cwd=script.parent, capture_output=True, text=True, timeout=240
    )


def test_accelerator_no_sync_runs_on_one_process(tmp_path):
    """Without a launcher the prepared model is the plain module: it has no `no_sync`; accelerate's is a no-op."""
    broken, fixed = fixed_copy("ld110_model_no_sync.py", tmp_path, codes="LD110")
    after = _run_single(fixed, tmp_path / "out-fixed")
    assert after.returncode == 0, after.stderr[-4000:]
    report = json.loads((tmp_path / "out-fixed" / "rank0.json").read_text())
    assert report["distributed_type"].endswith(".NO")
    assert len(report["step_grads"]) == 3
    before = _run_single(broken, tmp_path / "out-broken")
    assert before.returncode != 0
    assert "has no attribute 'no_sync'" in before.stderr
