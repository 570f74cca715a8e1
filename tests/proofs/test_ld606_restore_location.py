"""LD606 on CPU: there is no GPU here to show GPU 0's memory, so the proof shows the mechanism instead. A checkpoint
whose tensors carry the `cuda:0` tag (what rank 0 of a GPU job saves) is restored to that tag by every rank: a
`map_location` callable sees `cuda:0` on both gloo ranks, and the default load (map_location=None) tries to put
the tensors on CUDA whatever the rank; `map_location="cpu"` is honoured on both."""

from __future__ import annotations

import pytest

from tests.proofs.harness import SCRIPTS, run_ranks

pytestmark = pytest.mark.slow


def test_every_rank_restores_to_the_saved_device_unless_mapped(tmp_path):
    ranks = run_ranks(SCRIPTS / "ld606_restore_location.py", tmp_path / "out")
    assert len(ranks) == 2
    for report in ranks:
        assert report["tags"] == ["cuda:0"]  # the saved tag, not the rank's device
        assert "deserialize object on a CUDA device" in report["default"]
        assert report["mapped"] == "cpu"
