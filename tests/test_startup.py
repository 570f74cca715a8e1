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
    assert "libcst" not in warm_modules
    loaded, _ = _modules_after("check", "--output-format", "json", ".", cwd=tmp_path)
    assert "libcst" not in loaded and not any(m.startswith("lintdist.rules.ld") for m in loaded)

    # the warm run read the cache: a damaged cache file is ignored, never trusted
    cached = next(p for p in (tmp_path / ".lintdist_cache").rglob("*.json"))
    cached.write_text("{not json")
    _, again = _imports("check", "--output-format", "json", ".", cwd=tmp_path)
    assert json.loads(again.stdout) == json.loads(cold.stdout)


def _modules_after(*args: str, cwd) -> tuple[set[str], int]:
    """Every module loaded by a ``lintdist ...`` run (``-X importtime`` does not list modules that
    ``importlib.import_module`` loads through the editable install's finder)."""
    code = (
        "import json, runpy, sys\n"
        f"sys.argv = ['lintdist', *{list(args)!r}]\n"
        "try:\n    runpy.run_module('lintdist', run_name='__main__')\n"
        "except SystemExit as stop:\n    code = stop.code\n"
        "print(json.dumps([sorted(sys.modules), code]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, check=True)
    modules, code = json.loads(done.stdout.splitlines()[-1])
    return set(modules), code


def test_a_check_imports_only_the_rules_its_file_can_trigger(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(BROKEN)
    modules, code = _modules_after("check", "--no-cache", "--output-format", "json", str(script), cwd=tmp_path)
    assert code == 1
    imported = {m.rsplit(".", 1)[-1].split("_", 1)[0] for m in modules if m.startswith("lintdist.rules.ld")}
    assert "ld201" in imported  # the finding's rule
    assert "ld101" not in imported and "ld102" not in imported, imported  # no `accumulate(`, no token loss
    assert "lintdist.labels" not in modules  # only LD102 and LD111 follow labels
    other = tmp_path / "plot.py"
    other.write_text("import matplotlib.pyplot as plt\n\nplt.plot([1, 2])\n")
    modules, code = _modules_after("check", "--no-cache", "--output-format", "json", str(other), cwd=tmp_path)
    assert code == 0
    assert not any(m.startswith("lintdist.rules.ld") for m in modules)


def test_a_check_of_named_files_reads_no_ignore_patterns(tmp_path):
    """``pathspec`` matches `.gitignore` and `exclude` patterns while a folder is walked: a file named on the command
    line is checked without it (a pre-commit hook names files), a folder still honours the patterns."""
    script = tmp_path / "train.py"
    script.write_text(BROKEN)
    modules, code = _modules_after("check", "--no-cache", str(script), cwd=tmp_path)
    assert code == 1 and "pathspec" not in modules
    (tmp_path / ".gitignore").write_text("train.py\n")
    modules, code = _modules_after("check", "--no-cache", ".", cwd=tmp_path)
    assert code == 0 and "pathspec" in modules  # the ignored script is not checked
