"""Launch an acceptance case on 2 gloo ranks, plain or under `lintdist.runtime.watch`, and read what came out."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CASES = Path(__file__).resolve().parent / "cases"


@dataclass
class Run:
    """One launch: its exit code (None when we killed it at the deadline), timings, output and the watch report."""

    returncode: int | None
    started: float
    ended: float
    output: str
    report: dict[str, Any] | None
    nproc: int = 2

    @property
    def seconds(self) -> float:
        return self.ended - self.started

    @property
    def finished(self) -> bool:
        """Every rank printed DONE (the launch's exit code can still be a gloo teardown abort after that)."""
        return self.output.count("DONE rank=") == self.nproc

    @property
    def findings(self) -> list[dict[str, Any]]:
        return (self.report or {}).get("findings", [])

    def codes(self) -> list[str]:
        return sorted(finding["code"] for finding in self.findings)

    def finding(self, code: str) -> dict[str, Any]:
        matches = [finding for finding in self.findings if finding["code"] == code]
        assert len(matches) == 1, f"expected one {code} finding, got {self.codes()}:\n{self.output[-4000:]}"
        return matches[0]

    def loop_seconds(self) -> float:
        line = next(line for line in self.output.splitlines() if line.startswith("LOOP_SECONDS="))
        return float(line.split("=", 1)[1])


def launch(
    case: str,
    variant: str,
    tmp_path: Path,
    *,
    watch: bool,
    deadline: float = 90.0,
    args: tuple[str, ...] = (),
    launcher: str = "torchrun",
    env: dict[str, str] | None = None,
    nproc: int = 2,
    device: str = "cpu",
) -> Run:
    """Run `cases/<case> --variant <variant>` on `nproc` ranks; kill the whole tree at `deadline` seconds."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    report = tmp_path / f"{Path(case).stem}-{variant}-{'watch' if watch else 'plain'}.json"
    report.unlink(missing_ok=True)
    script = [str(CASES / case), "--variant", variant, *args, *(["--device", device] if device != "cpu" else [])]
    watcher = ["-m", "lintdist.runtime.watch", "--report", str(report)] if watch else []
    if launcher == "torchrun":
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
            *watcher,
            *script,
        ]
    elif launcher == "accelerate":
        # `--multi_gpu` is accelerate's torchrun launcher; on a machine without CUDA the ranks run on CPU/gloo.
        command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", f"--num_processes={nproc}"]
        command += ["--num_machines=1", "--mixed_precision=no", "--dynamo_backend=no", *watcher, *script]
    else:  # the script spawns its own ranks
        command = [sys.executable, *watcher, *script] if watch else [sys.executable, *script]
    environment = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        **({"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {}),
        "PYTHONFAULTHANDLER": "1",
        **(env or {}),
    }
    log = tmp_path / f"{report.stem}.log"
    with log.open("w+") as out:
        started = time.time()
        process = subprocess.Popen(
            command, cwd=tmp_path, env=environment, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            returncode = process.wait(timeout=deadline)
        except subprocess.TimeoutExpired:
            returncode = None
            _kill_tree(process)
        ended = time.time()
        out.seek(0)
        output = out.read()
    loaded = json.loads(report.read_text()) if report.exists() else None
    return Run(returncode, started, ended, output, loaded, nproc)


def _kill_tree(process: subprocess.Popen) -> None:
    # The launcher and its workers share the session started for it.
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def waited_since(finding: dict[str, Any]) -> float:
    """When the first rank began to wait in the diverged collective (wall clock)."""
    times = [rank.get("waiting_since") or rank.get("exited_at") for rank in finding["ranks"]]
    times = [moment for moment in times if moment]
    return min(times) if times else finding["reported_at"]


def rank_view(finding: dict[str, Any], rank: int) -> dict[str, Any]:
    return next(view for view in finding["ranks"] if view["rank"] == rank)


def case_line(case: str, text: str) -> int:
    """The 1-based line of `cases/<case>` whose stripped text is `text` (the first one)."""
    for number, line in enumerate((CASES / case).read_text().splitlines(), 1):
        if line.strip() == text:
            return number
    raise AssertionError(f"{text!r} not in {case}")
