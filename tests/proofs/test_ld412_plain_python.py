"""LD412's finding and fix run for real: a folder holds an accelerate script, an accelerate config asking for two
processes, and a launch file that starts the script with plain `python`. Run as written, accelerate never reads the
config and the job is one process (`DistributedType.NO`); the line the fix writes (`accelerate launch --config_file
...`) starts the two processes the config asks for. The config says MULTI_GPU; on this CPU machine the script asks
for `Accelerator(cpu=True)`, so the two processes meet over gloo (accelerate 1.15 `PartialState`: MULTI_CPU)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.proofs.harness import RUN_TIMEOUT_S, SCRIPTS

pytestmark = pytest.mark.slow

pytest.importorskip("accelerate", reason="the runtime extra (accelerate) is not installed")

CONFIG = """\
compute_environment: LOCAL_MACHINE
distributed_type: MULTI_GPU
num_processes: 2
num_machines: 1
machine_rank: 0
main_process_ip: 127.0.0.1
main_process_port: {port}
mixed_precision: "no"
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    folder.mkdir()
    shutil.copy(SCRIPTS / "ld412_count_processes.py", folder / "train.py")
    (folder / "accelerate_config.yaml").write_text(CONFIG.format(port=_free_port()))
    (folder / "run.sh").write_text("#!/usr/bin/env bash\npython train.py\n")
    return folder


def _run(folder: Path, out: Path) -> list[dict]:
    out.mkdir()
    env = {
        **os.environ,
        "PROOF_OUT": str(out),
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
        # the launch line's `python` and `accelerate` are this interpreter's
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }
    done = subprocess.run(
        ["bash", "run.sh"], cwd=folder, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


def test_plain_python_runs_one_process_and_the_fixed_launch_runs_the_config(tmp_path, lintdist):
    folder = _folder(tmp_path)
    found = lintdist("check", "--no-cache", "--select", "LD412", "--output-format", "json", str(folder))
    assert [f["code"] for f in json.loads(found.output)] == ["LD412"]

    before = _run(folder, tmp_path / "out-python")
    assert before == [{"num_processes": 1, "distributed_type": "DistributedType.NO"}]

    lintdist("check", "--no-cache", "--select", "LD412", "--fix", "--unsafe-fixes", str(folder))
    assert "accelerate launch --config_file accelerate_config.yaml train.py" in (folder / "run.sh").read_text()
    after = _run(folder, tmp_path / "out-launch")
    assert after == [{"num_processes": 2, "distributed_type": "DistributedType.MULTI_CPU"}] * 2
