"""LD704 proven with the installed torch: the fixed calls are valid `torch.amp` calls that behave as the
deprecated ones did, and no FutureWarning is left."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.proofs.harness import fixed_copy


def _run(script, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *options, str(script)], capture_output=True, text=True, timeout=120, check=False
    )


def test_fixed_amp_calls_run_without_deprecation_and_behave_the_same(tmp_path):
    broken, fixed = fixed_copy("ld704_amp_calls.py", tmp_path, codes="LD704")
    text = fixed.read_text()
    assert "torch.cuda.amp" not in text and "torch.cpu.amp" not in text
    assert 'torch.amp.autocast("cpu", enabled=True, dtype=torch.bfloat16)' in text
    assert 'torch.amp.GradScaler("cpu", 128.0, growth_interval=7)' in text
    assert '@custom_bwd(device_type="cuda")' in text

    # the broken script stops on the first deprecated call once its FutureWarning is an error
    strict = _run(broken, "-W", "error::FutureWarning")
    assert strict.returncode != 0 and "is deprecated" in strict.stderr
    before = _run(broken)
    assert before.returncode == 0, before.stderr
    assert "FutureWarning" in before.stderr

    after = _run(fixed, "-W", "error::FutureWarning")
    assert after.returncode == 0, after.stderr
    assert "FutureWarning" not in after.stderr
    expected = json.loads(before.stdout)
    assert json.loads(after.stdout) == expected
    assert expected["autocast_positional"] == "torch.bfloat16"  # enabled=True, dtype=bfloat16 kept their roles
    assert expected["cpu_scaler"] == [128.0, 7, True]
