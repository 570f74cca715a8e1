"""LD705 proven with the installed accelerate: the reported imports fail, the fixed ones give the real class."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.proofs.harness import SCRIPTS, fixed_copy


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("module", ["accelerate", "accelerate.utils"])
def test_the_reported_imports_fail(module):
    result = _python(f"from {module} import LocalSGD")
    assert result.returncode != 0 and "ImportError" in result.stderr
    assert "AttributeError" in _python("import accelerate; accelerate.LocalSGD").stderr


def test_the_fixed_script_imports_accelerates_local_sgd(tmp_path):
    broken, fixed = fixed_copy("ld705_imports.py", tmp_path, codes="LD705")
    assert "ImportError" in _python(broken.read_text()).stderr
    result = _python(fixed.read_text())
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["accelerate.local_sgd.LocalSGD", "Accelerator"]
    assert (SCRIPTS / "ld705_imports.py").read_text() == broken.read_text()
