"""LD307 shown on 2 gloo CPU ranks, as far as a CPU can show it (LD307 has no fix: this proves the finding).

accelerate 1.15 never takes its multi-device path on a CPU: `PartialState._prepare_backend` gives
`MULTI_CPU` (with `cpu=True`) or `NO` (without: `torchrun` on a CPU-only machine then runs one process per
rank, `num_processes` 1), and the context-parallel check of `AcceleratorState.__init__` (no plugin, or FSDP1,
raises ValueError) sits in the branch for `MULTI_GPU`/`MULTI_XPU`/... only. So on a real CPU run the check is
unreachable, and `cp_size=2` is rejected for *every* plugin, FSDP2 included, by another ValueError
(`ParallelismConfig._validate_accelerator`: only FSDP2, multi-device or DeepSpeed), because accelerate never
switches FSDP on for the CPU: the "cpu" case below records that. (The catalog's "on CPU or one process
`maybe_context_parallel` only logs a warning" is not what 1.15 does with `cp_size > 1`: the warning is for
`cp_size` 1; with `cp_size` 2 the `Accelerator` itself fails to build.)

To run the check itself, the script writes into `PartialState`'s shared state the distributed type a GPU node
would give (`MULTI_GPU`, same gloo group, CPU device), then builds the `Accelerator` with accelerate's own,
unpatched code: no plugin and an FSDP1 plugin raise the two ValueErrors LD307 names, an FSDP2 plugin builds an
FSDP2 accelerator with a `cp` mesh, `cp_size` 1 with FSDP1 builds, and `ACCELERATE_ALLOW_CP_STANDALONE` only
moves the failure into `_validate_accelerator`. The lint half checks that LD307 reports exactly the failing
shapes.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from lintdist.cli import cli
from tests.proofs.harness import SCRIPTS, run_ranks

pytestmark = pytest.mark.slow

HEADER = "from accelerate import Accelerator, FullyShardedDataParallelPlugin, ParallelismConfig\n\n"
SHAPES = {
    "none": "accelerator = Accelerator(parallelism_config=ParallelismConfig(cp_size=2))\n",
    "fsdp1": (
        "accelerator = Accelerator(\n"
        "    parallelism_config=ParallelismConfig(cp_size=2),\n"
        "    fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=1),\n"
        ")\n"
    ),
    "fsdp2": (
        "accelerator = Accelerator(\n"
        "    parallelism_config=ParallelismConfig(cp_size=2),\n"
        "    fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2),\n"
        ")\n"
    ),
}
CONFIG = "distributed_type: MULTI_GPU\nnum_processes: 2\n"


def test_lintdist_reports_the_shapes_accelerate_rejects(tmp_path):
    reported = {}
    for name, body in SHAPES.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "train.py").write_text(HEADER + body)
        (folder / "accelerate_config.yaml").write_text(CONFIG)  # the script's launch: 2 GPUs, no FSDP
        result = CliRunner().invoke(cli, ["check", "--no-cache", "--select", "LD307", str(folder / "train.py")])
        reported[name] = result.exit_code == 1
    assert reported == {"none": True, "fsdp1": True, "fsdp2": False}


def test_accelerate_rejects_context_parallelism_without_fsdp2(tmp_path):
    ranks = run_ranks(SCRIPTS / "ld307_cp_checks.py", tmp_path / "out")
    assert ranks[0] == ranks[1]
    outcome = ranks[0]
    # the real CPU run: rejected whatever the plugin, so the CPU cannot tell the cases apart
    assert outcome["cpu_cp2_fsdp2"].startswith("raised ValueError: ParallelismConfig is only compatible")
    assert outcome["cpu_cp2_fsdp2"].endswith("but got DistributedType.MULTI_CPU.")
    # the multi-device branch of AcceleratorState.__init__
    assert outcome["multi_gpu_cp2_none"].startswith(
        "raised ValueError: `cp_size > 1` specified in the `parallelism_config`, but no `fsdp_plugin` was provided"
    )
    assert outcome["multi_gpu_cp2_fsdp1"] == (
        "raised ValueError: Using `cp_size>1` requires FSDP2, but the provided `fsdp_plugin` is using FSDP1."
    )
    assert outcome["multi_gpu_cp2_fsdp2"] == "built FSDP fsdp2=True"
    assert outcome["multi_gpu_cp1_fsdp1"] == "built FSDP fsdp2=False"
    # the escape hatch skips the check; the Accelerator fails a few lines later all the same
    assert outcome["multi_gpu_cp2_none_standalone"].startswith("raised AttributeError")
    assert outcome["multi_gpu_cp2_fsdp1_standalone"].startswith(
        "raised ValueError: ParallelismConfig is only compatible"
    )
