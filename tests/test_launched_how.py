"""One script, launched every way lintdist reads: the findings that depend on the launch change, and only those.

``tests/data/launchers/train.py`` hard-codes the rendezvous (LD406 where a launcher provides one), picks its GPU
from the global rank (LD407 unless the launch shows one node) and saves a DDP model's state on every rank (LD601,
LD602: quiet on one process). Each case checks it as a project beside one launch file.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "data" / "launchers" / "train.py"
RENDEZVOUS = {("LD406", 9), ("LD406", 10)}
GLOBAL_RANK_DEVICE = {("LD407", 15)}
EVERY_RANK_SAVES = {("LD601", 23), ("LD602", 23)}
SPAWN = "    torch.multiprocessing.spawn(fit, nprocs=2)\n"

CASES = {
    # launchers that export MASTER_ADDR/MASTER_PORT: the script's values overwrite theirs
    "accelerate": (
        "run.sh",
        "accelerate launch --num_processes 2 train.py\n",
        RENDEZVOUS | GLOBAL_RANK_DEVICE | EVERY_RANK_SAVES,
    ),
    # torchrun's default --nnodes is 1: the global rank is the local one
    "torchrun": ("run.sh", "torchrun --nproc_per_node 2 train.py\n", RENDEZVOUS | EVERY_RANK_SAVES),
    "deepspeed": ("run.sh", "deepspeed --num_gpus 2 train.py\n", RENDEZVOUS | GLOBAL_RANK_DEVICE | EVERY_RANK_SAVES),
    "srun-torchrun": (
        "job.sh",
        "srun -N 2 torchrun --nnodes 2 --nproc_per_node 4 train.py\n",
        RENDEZVOUS | GLOBAL_RANK_DEVICE | EVERY_RANK_SAVES,
    ),
    # one process: nothing to rendezvous with, one GPU, one writer
    "python": ("run.sh", "python train.py\n", set()),
    "mpiexec-1": ("run.sh", "mpiexec -n 1 python train.py\n", set()),
    "srun-1": ("job.sh", "srun -n 1 python train.py\n", set()),
    # several processes, no rendezvous from the launcher: the script must set it
    "mpiexec-2": ("run.sh", "mpiexec -n 2 python train.py\n", GLOBAL_RANK_DEVICE | EVERY_RANK_SAVES),
    "srun-2-nodes": ("job.sh", "srun -N 2 python train.py\n", GLOBAL_RANK_DEVICE | EVERY_RANK_SAVES),
    "srun-readme": (
        "README.md",
        "# Cluster\n\n```bash\nsrun -N 2 python train.py\n```\n",
        GLOBAL_RANK_DEVICE | EVERY_RANK_SAVES,
    ),
    # the script starts its own processes, on one machine, and sets the rendezvous for them
    "mp.spawn": ("run.sh", "python train.py\n", EVERY_RANK_SAVES),
    # nothing says how it runs: every finding the code alone supports
    "no launch line": (None, "", RENDEZVOUS | GLOBAL_RANK_DEVICE | EVERY_RANK_SAVES),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_launcher_changes_exactly_the_findings_it_should(case, tmp_path, lintdist):
    launch_file, launch_text, expected = CASES[case]
    script = tmp_path / "train.py"
    shutil.copy(SCRIPT, script)
    if case == "mp.spawn":
        text = script.read_text()
        assert text.endswith("    fit()\n")
        script.write_text(text.removesuffix("    fit()\n") + SPAWN)  # same line numbers above
    if launch_file is not None:
        (tmp_path / launch_file).write_text(launch_text)
    result = lintdist("check", "--no-cache", "--output-format", "json", str(script))
    assert result.exit_code in {0, 1}, result.output
    assert {(f["code"], f["line"]) for f in json.loads(result.output)} == expected


def test_the_rendezvous_finding_names_the_launch_line_when_the_code_does_not_say(tmp_path, lintdist):
    (tmp_path / "train.py").write_text(
        'import os\n\nimport torch.distributed as dist\n\nos.environ["MASTER_PORT"] = "29533"\n'
        'dist.init_process_group("gloo", rank=0, world_size=1)\n'
    )
    (tmp_path / "job.sh").write_text("#!/bin/sh\nsrun -N 2 torchrun --nnodes 2 train.py\n")
    result = lintdist("check", "--no-cache", "--output-format", "json", str(tmp_path / "train.py"))
    [finding] = json.loads(result.output)
    assert finding["code"] == "LD406"
    assert "`torchrun` at " in finding["message"] and "job.sh:2 starts" in finding["message"]
    # a port written under torchrun points the workers away from the store the launcher hosts: an error
    assert finding["severity"] == "error" and "where nothing listens" in finding["message"]


def _script_launch(text: str):
    from lintdist.engine import check_text
    from lintdist.launch import script_launch
    from lintdist.registry import all_rules

    rules = [r for r in all_rules() if r.code == "LD406"]
    _, context = check_text(text, path=Path("train.py"), display="train.py", kind="python", rules=rules)
    return script_launch(context)


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        ("mp.spawn(fit, nprocs=4)", ("spawn", 4, 1, False)),
        ("mp.spawn(fit, (), 3)", ("spawn", 3, 1, False)),
        ("mp.spawn(fit)", ("spawn", 1, 1, False)),
        ("mp.start_processes(fit, nprocs=torch.cuda.device_count())", ("spawn", None, 1, False)),
        ("notebook_launcher(fit, num_processes=2)", ("notebook_launcher", 2, 1, True)),
        ("notebook_launcher(fit, num_processes=8, num_nodes=2)", ("notebook_launcher", 16, 2, True)),
        ("notebook_launcher(fit)", ("notebook_launcher", None, 1, True)),
    ],
)
def test_a_script_that_starts_its_own_processes_is_launched_by_that_call(call, expected):
    text = (
        "import torch\nimport torch.multiprocessing as mp\nfrom accelerate import notebook_launcher\n\n\n"
        f"def fit(index=0):\n    pass\n\n\n{call}\n# MASTER_PORT: the rule asked (LD406) reads this file\n"
    )
    launch = _script_launch(text)
    names = ("launcher", "processes", "nodes", "rendezvous")
    values = tuple(getattr(launch, n).value if getattr(launch, n) else None for n in names)
    assert values == expected
    assert (launch.launcher.path, launch.launcher.line) == ("train.py", 10)


def test_a_script_nothing_launches_knows_nothing():
    launch = _script_launch("import os\n\nos.environ['MASTER_PORT'] = '1'\n")
    assert (launch.launcher, launch.processes, launch.nodes, launch.rendezvous) == (None, None, None, None)
