"""The accelerate config `accelerate launch` reads when a line names none, and `--isolated`."""

from __future__ import annotations

import json

import pytest

SCRIPT = """\
from accelerate import Accelerator
from accelerate.local_sgd import LocalSGD

accelerator = Accelerator()
model, optimizer = accelerator.prepare(model, optimizer)
with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=8) as local_sgd:
    for batch in loader:
        local_sgd.step()
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    home = tmp_path / "hf-home"
    (home / "accelerate").mkdir(parents=True)
    (home / "accelerate" / "default_config.yaml").write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\n"
    )
    monkeypatch.setenv("HF_HOME", str(home))
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "train.py").write_text(SCRIPT)
    return folder, home / "accelerate" / "default_config.yaml"


def _findings(lintdist, folder, launch: str, *extra: str) -> list[dict]:
    (folder / "launch.sh").write_text(launch)
    result = lintdist("check", "--no-cache", "--output-format", "json", *extra, str(folder / "train.py"))
    return [f for f in json.loads(result.output) if f["code"] == "LD303"]


def test_a_line_without_config_file_reads_the_default_config(lintdist, project):
    folder, default = project
    [finding] = _findings(lintdist, folder, "accelerate launch --num_processes 2 train.py\n")
    assert f"at {default}:2" in finding["message"]


def test_isolated_and_lines_that_never_read_it(lintdist, project):
    folder, _ = project
    assert _findings(lintdist, folder, "accelerate launch train.py\n", "--isolated") == []
    assert _findings(lintdist, folder, "accelerate launch --cpu train.py\n") == []
    assert _findings(lintdist, folder, "torchrun --nproc_per_node 2 train.py\n") == []
    assert _findings(lintdist, folder, "python train.py\n") == []


def test_a_named_config_wins_over_the_default(lintdist, project):
    folder, _ = project
    (folder / "ddp.yaml").write_text("distributed_type: MULTI_GPU\nnum_processes: 2\n")
    assert _findings(lintdist, folder, "accelerate launch --config_file ddp.yaml train.py\n") == []
