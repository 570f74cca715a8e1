"""LD313 proven on 2 gloo ranks: a block run under reentrant activation checkpointing inside a DDP model built with
`find_unused_parameters=True` makes the first backward raise "Expected to mark a variable ready only once" on both
ranks; after LD313's unsafe fix (`use_reentrant=False`) the same script trains both steps and the ranks agree."""

from __future__ import annotations

import pytest

from tests.proofs.harness import fixed_copy, run_ranks

pytestmark = pytest.mark.slow

ERROR = "Expected to mark a variable ready only once"


def test_reentrant_checkpoint_with_unused_search_raises(tmp_path):
    broken, fixed = fixed_copy("ld313_reentrant_unused.py", tmp_path, codes="LD313", unsafe=True)
    assert "use_reentrant=False" in fixed.read_text()

    before = run_ranks(broken, tmp_path / "out-broken")
    after = run_ranks(fixed, tmp_path / "out-fixed")

    assert all(ERROR in (r["error"] or "") and r["steps"] == 0 for r in before)
    assert all(r["error"] is None and r["steps"] == 2 for r in after)
    assert after[0]["weights"] == after[1]["weights"]
