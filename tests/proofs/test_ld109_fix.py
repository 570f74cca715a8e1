"""LD109 proven by running it (one process): the plugin without `num_steps` steps the optimizer on every batch;
after --fix it takes the script's `gradient_accumulation_steps` and steps once per 4 batches."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.proofs.harness import RUN_TIMEOUT_S, fixed_copy

pytestmark = pytest.mark.slow


def _run(script, out_dir):
    out_dir.mkdir()
    env = {**os.environ, "PROOF_OUT": str(out_dir), "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    for name in [n for n in env if n.startswith("ACCELERATE_")]:
        del env[name]
    completed = subprocess.run(  # noqa: PLW1510 - the return code is asserted below, with the output
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    return json.loads((out_dir / "rank0.json").read_text())


def test_fixed_plugin_accumulates(tmp_path):
    broken, fixed = fixed_copy("ld109_plugin_count.py", tmp_path, codes="LD109")
    assert (
        "GradientAccumulationPlugin(num_steps=gradient_accumulation_steps, sync_each_batch=True)" in fixed.read_text()
    )

    assert _run(broken, tmp_path / "out-broken") == {"num_steps": 1, "optimizer_steps": 8}
    assert _run(fixed, tmp_path / "out-fixed") == {"num_steps": 4, "optimizer_steps": 2}
