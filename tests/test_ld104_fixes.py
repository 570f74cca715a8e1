"""LD104 end to end: its opt-in fixes through the CLI, and what accelerate and transformers make of them.

tests/test_fixtures.py runs ``--fix`` only, which leaves LD104's unsafe fixes alone. Here each fixture with a
``*.unsafe.fixed.py`` is copied with its folder (a script stays linked to the accelerate config beside it or the
launch file that names it), fixed with ``--unsafe-fixes`` and compared. The rewritten keywords are then handed to
the installed accelerate and transformers in a subprocess (an ``Accelerator`` sets process-wide state).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import libcst as cst
import pytest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "ld104"
FIXED = sorted(FIXTURES.rglob("*.unsafe.fixed.py"))


def _source(fixed: Path) -> Path:
    return fixed.with_name(fixed.name.replace(".unsafe.fixed.py", ".py"))


def _copy(source: Path, tmp_path: Path) -> Path:
    """The fixture and the files beside it (not the sub-folders of ``fixtures/ld104`` itself)."""
    folder = tmp_path / source.parent.name
    folder.mkdir()
    for path in source.parent.iterdir():
        if path.is_file() and ".fixed." not in path.name:
            shutil.copy(path, folder / path.name)
    return folder / source.name


@pytest.mark.parametrize("fixed", FIXED, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_unsafe_fix_gives_expected_output(fixed, tmp_path, lintdist):
    target = _copy(_source(fixed), tmp_path)
    lintdist("check", "--fix", "--no-cache", "--select", "LD104", str(target))
    assert target.read_bytes() == _source(fixed).read_bytes(), "an unsafe fix must wait for --unsafe-fixes"
    lintdist("check", "--fix", "--unsafe-fixes", "--no-cache", "--select", "LD104", str(target))
    assert target.read_text() == fixed.read_text()
    cst.parse_module(target.read_text())
    after = lintdist("check", "--no-cache", "--select", "ALL", "--output-format", "json", str(target))
    assert [f for f in json.loads(after.output) if f["code"] == "LD104"] == [], "the fix removes the finding"


def _keyword_values(path: Path, callee: str, keyword: str) -> list[str]:
    """The source of ``keyword=`` in every call of ``callee`` (by its last name) in a file."""
    module = cst.parse_module(path.read_text())
    found: list[str] = []

    class Visitor(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            name = node.func.attr.value if isinstance(node.func, cst.Attribute) else getattr(node.func, "value", "")
            if name == callee:
                found.extend(
                    module.code_for_node(a.value) for a in node.args if a.keyword and a.keyword.value == keyword
                )

    module.visit(Visitor())
    return found


CHECK = """
import sys, tempfile
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin
from transformers import TrainingArguments

names = {"GradientAccumulationPlugin": GradientAccumulationPlugin, "args": type("A", (), {"accumulation": 8})}
plugin = eval(sys.argv[1], names)
accelerator = Accelerator(gradient_accumulation_plugin=plugin)
assert accelerator.gradient_accumulation_steps == 8, accelerator.gradient_accumulation_steps
assert accelerator.gradient_state.plugin_kwargs["sync_each_batch"] is True
arguments = TrainingArguments(
    output_dir=tempfile.mkdtemp(), gradient_accumulation_steps=4, accelerator_config=eval(sys.argv[2])
)
assert arguments.accelerator_config.gradient_accumulation_kwargs == {"sync_each_batch": True}
assert arguments.accelerator_config.dispatch_batches is False
print("ok")
"""


def test_fixed_keywords_are_accepted_by_accelerate_and_transformers():
    plugin = _keyword_values(
        FIXTURES / "accelerate_yaml" / "train.unsafe.fixed.py", "Accelerator", "gradient_accumulation_plugin"
    )
    config = _keyword_values(
        FIXTURES / "hf_trainer_launch" / "finetune.unsafe.fixed.py", "TrainingArguments", "accelerator_config"
    )
    assert len(plugin) == 1 and len(config) == 1
    result = subprocess.run(
        [sys.executable, "-c", CHECK, plugin[0], config[0]], check=False, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("ok")
