"""LD310 proven on raw FSDP1 (1 gloo CPU rank), since Lightning is not a test dependency.

Lightning 2.6's `FSDPStrategy` passes its `mixed_precision` keyword, when set, straight to
`FullyShardedDataParallel(mixed_precision=...)`; without it, the precision plugin's policy
(`FSDPPrecision("bf16-mixed").mixed_precision_config`: bf16 parameters, reduction and buffers). The test fixes
a Lightning script with the real CLI (the string goes, the `Trainer` gets `precision="bf16-mixed"`), then runs
FSDP1 with the three values the strategy can pass: the string raises the AttributeError, None wraps the module,
and the policy `precision="bf16-mixed"` makes Lightning build wraps it and computes in bfloat16.
"""

from __future__ import annotations

import pytest

from tests.proofs.harness import SCRIPTS, fixed_copy, run_ranks

pytestmark = pytest.mark.slow


def test_string_policy_crashes_fsdp_and_the_fix_asks_the_trainer(tmp_path):
    broken, fixed = fixed_copy("ld310_lightning_trainer.py", tmp_path, codes="LD310")
    assert 'FSDPStrategy(mixed_precision="bf16")' in broken.read_text()
    text = fixed.read_text()
    assert "mixed_precision" not in text
    assert 'strategy=FSDPStrategy(), precision="bf16-mixed")' in text

    (outcome,) = run_ranks(SCRIPTS / "ld310_fsdp_string_policy.py", tmp_path / "out", nproc=1)
    assert outcome == {
        "string": "raised AttributeError: 'str' object has no attribute 'param_dtype'",
        "none": "wrapped float32",
        "bf16_mixed_policy": "wrapped bfloat16",
    }
