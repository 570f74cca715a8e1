"""LD601 proven by running it: on 2 gloo ranks, the broken scripts serialize the checkpoint on every rank; after
`--fix` only rank 0 does, and the file it wrote loads."""

from __future__ import annotations

import pytest
import torch

from tests.proofs.harness import fixed_copy, run_ranks

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("script", "rewritten", "checkpoint"),
    [
        (
            "ld601_every_rank_saves.py",
            "accelerator.save(accelerator.unwrap_model(model).state_dict(), sink)",
            "ckpt.pt",
        ),
        ("ld601_raw_ddp_saves.py", "if not dist.is_initialized() or dist.get_rank() == 0:", "opt.pt"),
    ],
)
def test_fixed_script_writes_on_rank_zero_only(tmp_path, script, rewritten, checkpoint):
    broken, fixed = fixed_copy(script, tmp_path, codes="LD601")
    assert rewritten in fixed.read_text()

    broken_ranks = run_ranks(broken, tmp_path / "out-broken")
    fixed_ranks = run_ranks(fixed, tmp_path / "out-fixed")

    assert [r["wrote"] for r in broken_ranks] == [True, True], "every rank serializes the same file before the fix"
    assert [r["wrote"] for r in fixed_ranks] == [True, False], "only rank 0 writes after the fix"
    assert torch.load(tmp_path / "out-fixed" / checkpoint, weights_only=True)
