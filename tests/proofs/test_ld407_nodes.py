"""LD407 proven on two simulated nodes: two torchrun launches (--nnodes=2, --node_rank=0/1, two processes each) on
this machine. Reading the device from RANK gives the second node's processes indices 2 and 3, past a 2-GPU node's
last device ("invalid device ordinal"); after the unsafe fix, LOCAL_RANK gives 0 and 1 on each node."""

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

NODES, PER_NODE = 2, 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_nodes(script: Path, out_dir: Path) -> list[dict]:
    """Both "nodes" at once, meeting at one static rendezvous; each rank's JSON report, by global rank."""
    out_dir.mkdir(parents=True)
    env = {**os.environ, "PROOF_OUT": str(out_dir), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    port = _free_port()
    launches = []
    for node in range(NODES):
        command = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={NODES}", f"--node_rank={node}"]
        command += [f"--nproc_per_node={PER_NODE}", "--master_addr=127.0.0.1", f"--master_port={port}", str(script)]
        log = (out_dir / f"node{node}.log").open("w")
        launches.append((subprocess.Popen(command, env=env, cwd=script.parent, stdout=log, stderr=log), log))
    try:
        for process, _ in launches:
            assert process.wait(timeout=RUN_TIMEOUT_S) == 0, (out_dir / "node0.log").read_text()[-4000:]
    finally:
        for process, log in launches:
            if process.poll() is None:
                process.kill()
                process.wait()
            log.close()
    return [json.loads((out_dir / f"rank{rank}.json").read_text()) for rank in range(NODES * PER_NODE)]


def test_global_rank_device_is_invalid_on_the_second_node(tmp_path):
    broken, fixed = fixed_copy("ld407_node_device.py", tmp_path, codes="LD407", unsafe=True)
    assert 'torch.device("cuda", int(os.environ["LOCAL_RANK"]))' in fixed.read_text()

    before = _two_nodes(broken, tmp_path / "out-broken")
    after = _two_nodes(fixed, tmp_path / "out-fixed")

    # The launches really made two nodes: the second node's processes have global ranks 2, 3 and local ranks 0, 1.
    assert [(r["rank"], r["local_rank"]) for r in before] == [(0, 0), (1, 1), (2, 0), (3, 1)]
    # From the global rank: node 1 asks for devices 2 and 3, which a 2-GPU node does not have.
    assert [r["index"] for r in before] == [0, 1, 2, 3]
    assert [r["valid"] for r in before] == [True, True, False, False]
    # From the local rank: every process gets a device of its node, and no two processes of a node share one.
    assert [r["index"] for r in after] == [0, 1, 0, 1]
    assert all(r["valid"] for r in after)
    pairs = after[0]["pairs"]
    assert len({tuple(p) for p in pairs}) == NODES * PER_NODE
