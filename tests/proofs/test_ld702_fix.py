"""LD702 proven with the installed accelerate and torch: each reported hook spelling fails or registers nothing,
and the fixed script registers the hook it asked for (one gloo rank in a subprocess, a few seconds each)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.proofs.harness import SCRIPTS, fixed_copy


def _run(script) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False, env=env
    )


def _hook(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr[-4000:]
    return next(line for line in result.stdout.splitlines() if line.startswith("hook:")).split(": ", 1)[1]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "broken_error", "hook"),
    [
        ("ld702_kwargs_handler.py", "TypeError: KwargsHandler() takes no arguments", "fp16_compress_hook"),
        ("ld702_string_hook.py", None, "powerSGD_hook"),
        ("ld702_swapped_register.py", "TypeError: Communication hook must be callable.", "fp16_compress_hook"),
    ],
)
def test_the_fixed_script_registers_the_hook(tmp_path, script, broken_error, hook):
    broken, fixed = fixed_copy(script, tmp_path, codes="LD702")
    assert (SCRIPTS / script).read_text() == broken.read_text()
    before = _run(broken)
    if broken_error is None:
        # accepted without a word, and DDP runs its plain all-reduce: the string matched no hook
        assert _hook(before) == "None"
    else:
        assert before.returncode != 0 and broken_error in before.stderr
    assert _hook(_run(fixed)) == hook


def test_the_handler_class_and_keyword_fail_in_accelerate():
    from accelerate.utils import DDPCommunicationHookType, DistributedDataParallelKwargs, KwargsHandler

    with pytest.raises(TypeError, match="takes no arguments"):
        KwargsHandler(ddp_communication_hook=None)
    with pytest.raises(TypeError, match="unexpected keyword argument 'ddp_communication_hook'"):
        DistributedDataParallelKwargs(ddp_communication_hook=None)
    # a plain Enum: the string is not equal to the member, so `hook_map.get("fp16")` finds nothing
    assert not isinstance(DDPCommunicationHookType.FP16, str) and DDPCommunicationHookType.FP16 != "fp16"
