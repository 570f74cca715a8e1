"""LD312 proven on 2 gloo CPU ranks: an SGD optimizer built from `model.parameters()` before the model is wrapped by
`FullyShardedDataParallel` (torch's default `use_orig_params=False`) or sharded by `fully_shard` holds tensors the
wrapped model no longer computes with: none of them gets a gradient and 3 steps leave the wrapped model's weights
unchanged. After LD312's unsafe fix (the optimizer built after the wrap) both wrappers train."""

from __future__ import annotations

import pytest

from tests.proofs.harness import fixed_copy, run_ranks

pytestmark = pytest.mark.slow

SCRIPT = "ld312_optimizer_before_wrap.py"


@pytest.mark.parametrize("wrapper", ["fsdp1", "fsdp2"])
def test_optimizer_built_before_the_wrap_never_trains(tmp_path, wrapper):
    broken, fixed = fixed_copy(SCRIPT, tmp_path, codes="LD312", unsafe=True)

    before = run_ranks(broken, tmp_path / "out-broken", args=(wrapper,))
    after = run_ranks(fixed, tmp_path / "out-fixed", args=(wrapper,))

    assert all(r["graded"] == 0 and not r["changed"] for r in before)
    assert all(r["graded"] > 0 and r["changed"] for r in after)
