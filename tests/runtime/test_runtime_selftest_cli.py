"""The self-test as users run it: under torchrun with two ranks, and as one plain process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

HELPERS = (
    "token-loss (raw DDP",
    "token-loss (accelerate MULTI_CPU",
    "token-loss (FSDP1",
    "token-loss (FSDP2",
    "token-loss-wrong-recipes",
    "grad-sync (raw DDP",
    "grad-sync (FSDP1",
    "grad-sync (FSDP2",
    "set-epoch",
    "any-rank",
    "main-process-first",
    "scheduler-total-steps",
    "shift-labels",
    "token-windows (accelerate MULTI_CPU",
    "token-windows (raw DDP",
)


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=240, check=False)


def _assert_all_pass(result: subprocess.CompletedProcess[str], world_size: int) -> list[str]:
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith(("PASS ", "FAIL ", "SKIP "))]
    assert lines and all(line.startswith("PASS ") for line in lines), "\n".join(lines)
    for helper in HELPERS:
        assert any(line.startswith(f"PASS {helper}") for line in lines), helper
    assert f"PASS token-loss (raw DDP, W={world_size}, G=3): max |grad - ref| = " in result.stdout
    assert result.stdout.rstrip().endswith(f"PASS: {len(lines)}/{len(lines)} checks passed")
    return lines


def test_selftest_under_torchrun_with_two_ranks() -> None:
    result = _run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "lintdist.runtime.selftest",
            "--backend",
            "gloo",
            "--timeout",
            "60",
        ]
    )
    lines = _assert_all_pass(result, world_size=2)
    # Rank 0 prints; the other rank only contributes its verdicts.
    assert len(lines) == len(set(lines))


def test_selftest_as_a_single_process_without_a_launcher() -> None:
    env_free = {key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    result = subprocess.run(
        [sys.executable, "-m", "lintdist.runtime.selftest", "--backend", "gloo"],
        capture_output=True,
        text=True,
        env={**env_free, "OMP_NUM_THREADS": "1"},
        timeout=240,
        check=False,
    )
    _assert_all_pass(result, world_size=1)
