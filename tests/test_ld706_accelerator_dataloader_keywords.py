"""LD706 against the installed accelerate: the keywords it reports fail as it says, and its fix sets the options.

Each case runs in a fresh interpreter (accelerate keeps process-wide state), on the CPU, with one process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

from lintdist.cli import cli

pytest.importorskip("accelerate", reason="the runtime extra (accelerate) is not installed")

BROKEN = textwrap.dedent(
    """\
    from accelerate import Accelerator

    accelerator = Accelerator(split_batches=True, even_batches=False, cpu=True)
    print(accelerator.split_batches, accelerator.even_batches)
    """
)


def _run(source: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", source], check=False, capture_output=True, text=True, timeout=300)


def test_split_batches_keyword_is_ignored_by_the_installed_accelerate():
    result = _run("from accelerate import Accelerator\nprint(Accelerator(split_batches=True, cpu=True).split_batches)\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False"]


@pytest.mark.parametrize("keyword", ["dispatch_batches", "even_batches", "use_seedable_sampler"])
def test_removed_keywords_raise_type_error(keyword):
    result = _run(f"from accelerate import Accelerator\nAccelerator({keyword}=False, cpu=True)\n")
    assert result.returncode != 0
    assert f"unexpected keyword argument '{keyword}'" in result.stderr


def test_the_fix_makes_the_options_take_effect(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(BROKEN)
    assert "even_batches" in _run(BROKEN).stderr  # as written it stops with a TypeError
    runner = CliRunner()
    result = runner.invoke(
        cli, ["check", "--no-cache", "--select", "LD706", "--fix", "--unsafe-fixes", str(script)], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    fixed = script.read_text()
    assert "dataloader_config=DataLoaderConfiguration(split_batches=True, even_batches=False)" in fixed
    ran = _run(fixed)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["True", "False"]
