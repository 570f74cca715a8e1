"""Run a training script on 2 gloo ranks with torchrun, and fix a copy of it with the real CLI.

The fix proofs lint a broken script, fix it with ``lintdist check --fix``, and
run both versions as real multi-process jobs. Each script writes what it
measured (gradients, sample orders, results) as JSON to ``$PROOF_OUT/rank<R>.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

from click.testing import CliRunner

from lintdist.cli import cli

SCRIPTS = Path(__file__).resolve().parent / "scripts"
# A launch takes 5 to 40 s on 2 cores; one that has not ended after this is hung, not slow.
RUN_TIMEOUT_S = 150


def fixed_copy(name: str, tmp_path: Path, *, codes: str, unsafe: bool = False) -> tuple[Path, Path]:
    """Copy ``scripts/<name>`` twice into ``tmp_path``; fix the second with ``--fix``. Returns (broken, fixed)."""
    broken = tmp_path / "broken" / name
    fixed = tmp_path / "fixed" / name
    for target in (broken, fixed):
        target.parent.mkdir(parents=True)
        shutil.copy(SCRIPTS / name, target)
    runner = CliRunner()
    before = runner.invoke(cli, ["check", "--no-cache", "--select", codes, str(broken)], catch_exceptions=False)
    assert before.exit_code == 1, f"the broken script must be reported:\n{before.output}"
    args = ["check", "--no-cache", "--fix", "--select", codes, str(fixed)] + (["--unsafe-fixes"] if unsafe else [])
    result = runner.invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, f"--fix must leave no finding:\n{result.output}"
    assert fixed.read_text() != broken.read_text()
    return broken, fixed


def run_ranks(script: Path, out_dir: Path, *, nproc: int = 2, args: tuple[str, ...] = ()) -> list[dict]:
    """Run ``script`` under ``torchrun --standalone`` on ``nproc`` CPU ranks; return each rank's JSON report.

    A launch that hangs (seen once in CI, with no output, and never reproduced) has every process's Python stack
    dumped, is killed, and is run once more with a printed warning that carries the stacks; a second hang fails.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PROOF_OUT": str(out_dir),
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
        # SIGABRT then prints each process's Python stack (faulthandler)
        "PYTHONFAULTHANDLER": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(script.parent), os.environ.get("PYTHONPATH")])),
    }
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    command += [str(script), *args]
    hung = []
    for attempt in range(2):
        returncode, output = _launch(command, env, script.parent, out_dir / f"launch{attempt}.log")
        if returncode is not None:
            break
        hung.append(output[-6000:])
        warnings.warn(f"{script.name}: torchrun hung for {RUN_TIMEOUT_S} s and was run again; stacks:\n{hung[-1]}")
    assert len(hung) < 2, f"{script} hung twice:\n" + "\n----\n".join(hung)
    reports = [out_dir / f"rank{rank}.json" for rank in range(nproc)]
    if returncode != 0 and _teardown_abort(output) and all(report.exists() for report in reports):
        # gloo sometimes aborts a process at interpreter exit ("terminate called without an active exception"),
        # after the script finished and wrote its report; plain torch does it too (tests/watch/cases/CASES.md).
        warnings.warn(f"{script.name}: a rank aborted at exit after writing its report (gloo teardown)")
    else:
        assert returncode == 0, f"{script} failed:\n{output[-8000:]}"
    return [json.loads(report.read_text()) for report in reports]


def _teardown_abort(output: str) -> bool:
    """gloo's abort at interpreter exit, with no Python error before it."""
    before, marker, _after = output.partition("terminate called without an active exception")
    return bool(marker) and "Traceback" not in before


def _launch(command: list[str], env: dict, cwd: Path, log: Path) -> tuple[int | None, str]:
    """(return code, output); the return code is None when the launch did not end within RUN_TIMEOUT_S."""
    with log.open("w+") as out:
        process = subprocess.Popen(command, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        try:
            returncode = process.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            returncode = None
            _abort_tree(process)
        out.seek(0)
        return returncode, out.read()


def _abort_tree(process: subprocess.Popen) -> None:
    """SIGABRT the launcher and its workers (they run in their own sessions), then SIGKILL what is left."""
    tree = [process.pid, *_descendants(process.pid)]
    for sig in (signal.SIGABRT, signal.SIGKILL):
        for pid in tree:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        time.sleep(3)
    process.wait()


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found
