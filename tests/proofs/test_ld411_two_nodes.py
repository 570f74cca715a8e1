"""LD411 proven on two simulated nodes: two torchrun launches (--nnodes=2, --node_rank=0/1, one process each) on
this machine, meeting at one static rendezvous. Given LOCAL_RANK as its rank, each node's process claims rank 0 of
a group of two, nobody is rank 1, and `init_process_group` fails at its 20 s timeout waiting for rank 1's address;
after the fix, RANK gives 0 and 1 and the group forms."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.proofs.harness import RUN_TIMEOUT_S, fixed_copy

pytestmark = pytest.mark.slow

NODES = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_nodes(script: Path, out_dir: Path) -> tuple[list[int], list[str]]:
    """Both "nodes" at once; each launch's exit code and output."""
    out_dir.mkdir(parents=True)
    env = {**os.environ, "PROOF_OUT": str(out_dir), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    port = _free_port()
    launches = []
    for node in range(NODES):
        command = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={NODES}", f"--node_rank={node}"]
        command += ["--nproc_per_node=1", "--master_addr=127.0.0.1", f"--master_port={port}", str(script)]
        log = (out_dir / f"node{node}.log").open("w+")
        launches.append((subprocess.Popen(command, env=env, cwd=script.parent, stdout=log, stderr=log), log))
    codes, outputs = [], []
    try:
        for process, log in launches:
            codes.append(process.wait(timeout=RUN_TIMEOUT_S))
            log.seek(0)
            outputs.append(log.read())
    finally:
        for process, log in launches:
            if process.poll() is None:
                process.kill()
                process.wait()
            log.close()
    return codes, outputs


def test_local_rank_as_rank_never_forms_the_group_of_two_nodes(tmp_path):
    broken, fixed = fixed_copy("ld411_local_rank_group.py", tmp_path, codes="LD411", unsafe=True)
    assert 'rank=int(os.environ["RANK"])' in fixed.read_text()

    codes, outputs = _two_nodes(broken, tmp_path / "out-broken")
    # Both nodes fail: each process is rank 0, and both wait for rank 1's address until the timeout.
    assert all(code != 0 for code in codes), outputs[0][-4000:]
    assert all("wait timeout" in output and "/0/1" in output for output in outputs), outputs[0][-4000:]
    assert not list((tmp_path / "out-broken").glob("rank*.json"))

    codes, outputs = _two_nodes(fixed, tmp_path / "out-fixed")
    assert codes == [0, 0], outputs[0][-4000:]
    reports = [json.loads((tmp_path / "out-fixed" / f"rank{r}.json").read_text()) for r in range(NODES)]
    # One process per node: both have local rank 0, and with RANK they are ranks 0 and 1 of one group.
    assert [(r["rank"], r["local_rank"]) for r in reports] == [(0, 0), (1, 0)]
    assert all(r["ranks"] == [0, 1] for r in reports)
