"""Cases 1, 3 and 8 with NCCL on CUDA devices (skipped, with the reason printed, where there are too few).

NCCL refuses two ranks on one device, so the divergence cases need two GPUs; with one, case 8's benchmark and the
flight-recorder reading run at world size 1.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from .harness import case_line, launch, rank_view, waited_since

pytestmark = [pytest.mark.gpu, pytest.mark.slow]
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


def _need(devices: int) -> None:
    if GPUS < devices:
        pytest.skip(
            f"needs {devices} CUDA device(s) for NCCL ranks (NCCL refuses two ranks on one device); found {GPUS}"
        )


def test_recorder_counters_and_entries_under_nccl(tmp_path: Path) -> None:
    _need(1)
    script = tmp_path / "probe.py"
    script.write_text(
        textwrap.dedent("""\
        import json, torch, torch.distributed as dist
        from lintdist.runtime.watch import probe
        dist.init_process_group("nccl")
        torch.cuda.set_device(0)
        tensor = torch.ones(4, device="cuda")
        for _ in range(5):
            dist.all_reduce(tensor)
        torch.cuda.synchronize()
        entries = probe.recorded(limit=10, stacks=True) or []
        print(json.dumps({"progress": probe.progress(), "entries": [e.as_dict() for e in entries]}))
        dist.destroy_process_group()
        """)
    )
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", str(script)]
    result = subprocess.run(command, check=False, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("{")))
    print(seen)
    (enqueued, completed), *_ = seen["progress"].values()
    assert enqueued >= 5 and completed <= enqueued
    ops = [entry["op"] for entry in seen["entries"]]
    assert ops.count("nccl:all_reduce") >= 5, ops
    assert any(entry["site"] and entry["site"][0].endswith("probe.py") for entry in seen["entries"])


def test_case1_save_state_guard_nccl(tmp_path: Path) -> None:
    _need(2)
    run = launch(
        "save_state_guard.py", "broken", tmp_path, watch=True, device="cuda", args=("--out", str(tmp_path / "o"))
    )
    finding = run.finding("LD405")
    assert rank_view(finding, 0)["line"] == case_line("save_state_guard.py", "accelerator.save_state()")
    assert finding["reported_at"] - waited_since(finding) <= 15.0 and run.returncode not in (0, None)


@pytest.mark.parametrize("variant", ["broken", "exit"])
def test_case3_local_early_stop_nccl(tmp_path: Path, variant: str) -> None:
    _need(2)
    run = launch("local_break.py", variant, tmp_path, watch=True, device="cuda")
    finding = run.finding("LD402")
    assert f"`break` at line {case_line('local_break.py', 'break')}" in finding["message"]
    assert finding["reported_at"] - waited_since(finding) <= 15.0 and run.returncode not in (0, None)


def test_case8_no_sync_nccl(tmp_path: Path) -> None:
    _need(2)
    run = launch("no_sync_all.py", "broken", tmp_path, watch=True, device="cuda")
    assert run.finding("LD110")["evidence"]["step"] == 1


def test_case8_benchmark_nccl_keeps_the_collectives(tmp_path: Path) -> None:
    """Under NCCL too the watcher adds no collective; what it costs is measured by
    `benchmarks/watch_cost.py --device cuda`."""
    _need(1)
    nproc = min(2, GPUS)
    sequences: dict[int, list] = {}
    for watch in (True, False):
        out = tmp_path / f"run-{watch}"
        out.mkdir()
        env = {"CASE_SEQUENCE": str(out), "TORCH_FR_BUFFER_SIZE": "20000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "20000"}
        run = launch("no_sync_all.py", "benchmark", out, watch=watch, env=env, nproc=nproc, device="cuda")
        assert run.finished, run.output[-3000:]
        if watch:
            assert run.codes() == [], run.output[-3000:]
        for rank in range(nproc):
            entries = json.loads((out / f"rank{rank}.json").read_text())["entries"]
            assert sequences.setdefault(rank, entries) == entries, "the collective sequence changed"
    assert len(sequences[0]) > 3500
