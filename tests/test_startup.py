"""What each command imports: start-up is most of a pre-commit run, so the heavy modules load only when needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from test_cli import BROKEN, CLEAN

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _imports(*args: str, cwd) -> tuple[set[str], subprocess.CompletedProcess]:
    """The modules a ``python -m lintdist ...`` process imports (from ``-X importtime``), and the process."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "lintdist", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    modules = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    return modules, done


def test_version_imports_neither_libcst_nor_the_rules(tmp_path):
    modules, done = _imports("--version", cwd=tmp_path)
    assert done.returncode == 0 and "lintdist" in done.stdout
    assert "libcst" not in modules and not any(m.startswith("lintdist.rules.") for m in modules)


def test_rule_documentation_loads_no_codemod_or_matchers(tmp_path):
    for command in (("rule", "LD201"), ("rules",)):
        modules, done = _imports(*command, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-500:]
        assert not {"libcst.codemod", "libcst.matchers", "lintdist.engine"} & modules, command


def test_codemod_loads_only_when_a_fix_adds_an_import(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(BROKEN)
    modules, done = _imports("check", "--no-cache", "--fix", str(script), cwd=tmp_path)
    assert done.returncode == 0 and script.read_text() == CLEAN
    assert "libcst.codemod" not in modules and "libcst.matchers" not in modules, "`sampler.set_epoch` needs no import"
    fixture = FIXTURES / "ld201" / "constructor_injected_loader.py"
    script.write_text(fixture.read_text())
    modules, done = _imports("check", "--no-cache", "--fix", str(script), cwd=tmp_path)
    assert script.read_text() == fixture.with_name("constructor_injected_loader.fixed.py").read_text()
    assert "libcst.codemod" in modules, "this fix adds `from lintdist.runtime import set_epoch`"


def test_a_warm_run_imports_no_libcst_and_reports_the_same(tmp_path):
    (tmp_path / "train.py").write_text(BROKEN)
    (tmp_path / "clean.py").write_text(CLEAN)
    cold_modules, cold = _imports("check", "--output-format", "json", ".", cwd=tmp_path)
    assert "libcst" in cold_modules
    warm_modules, warm = _imports("check", "--output-format", "json", ".", cwd=tmp_path)
    assert json.loads(warm.stdout) == json.loads(cold.stdout) and warm.returncode == cold.returncode == 1
    assert "libcst" not in warm_modules and not any(m.startswith("lintdist.rules.") for m in warm_modules)

    # a damaged rule catalogue is rebuilt, never trusted
    catalogue = next((tmp_path / ".lintdist_cache").rglob("rules.json"))
    catalogue.write_text("{not json")
    _, again = _imports("check", "--output-format", "json", ".", cwd=tmp_path)
    assert json.loads(again.stdout) == json.loads(cold.stdout)
    assert json.loads(catalogue.read_text())["rules"]
