"""LD412's message says what the one process does with the GPUs: one GPU for an Accelerator loop, every visible GPU
through `nn.DataParallel` for a script that trains with a transformers Trainer (transformers
`TrainingArguments.n_gpu`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "ld412"


def _messages(lintdist, tmp_path: Path, name: str) -> list[str]:
    folder = tmp_path / name
    shutil.copytree(FIXTURES / name, folder)
    result = lintdist("check", "--no-cache", "--select", "LD412", "--output-format", "json", str(folder))
    return [finding["message"] for finding in json.loads(result.output)]


def test_an_accelerator_loop_under_plain_python_runs_on_one_gpu(lintdist, tmp_path):
    (message,) = _messages(lintdist, tmp_path, "plain_python")
    assert "one process (`DistributedType.NO`) on one GPU" in message
    assert "DataParallel" not in message


def test_a_trainer_script_under_plain_python_runs_data_parallel_not_the_configs_processes(lintdist, tmp_path):
    (message,) = _messages(lintdist, tmp_path, "trainer_data_parallel")
    assert "the transformers `Trainer` drives every visible GPU through `nn.DataParallel`" in message
    assert "on one GPU" not in message
    assert "`accelerate launch --config_file default_config.yaml sft.py`" in message
