"""LD408 proven by running it: decoding on an FSDP2-sharded model where ranks stop at different lengths hangs
with `synced_gpus=False` (caught by a short process-group timeout); after --fix (`synced_gpus=True`) every rank
runs forwards until all are done, and the launch ends."""

from __future__ import annotations

import pytest

from tests.proofs.harness import fixed_copy, run_ranks
from tests.proofs.test_ld402_fix import _broken_launch

pytestmark = pytest.mark.slow


def test_synced_decoding_finishes_where_unsynced_hangs(tmp_path, monkeypatch):
    broken, fixed = fixed_copy("ld408_generate_unsynced.py", tmp_path, codes="LD408")
    assert "synced_gpus=True)" in fixed.read_text()

    # Broken: rank 0 is done after 3 tokens and waits at the barrier; rank 1's 4th forward all-gathers the sharded
    # parameters, which rank 0 never joins. Both time out.
    returncode, output, reports = _broken_launch(broken, tmp_path / "out-broken", monkeypatch)
    assert returncode != 0, "the unsynced decoding must not finish cleanly"
    assert "Timed out" in output, f"the ranks must have waited for each other until the timeout:\n{output[-4000:]}"
    assert reports.get(0) == {"new_tokens": 3, "forwards": 3}
    assert 1 not in reports, "rank 1 must never finish decoding"

    # Fixed: rank 0 runs 3 dummy forwards more, so both ranks run 6 forwards, and each keeps its own length.
    ranks = run_ranks(fixed, tmp_path / "out-fixed")
    assert ranks == [{"new_tokens": 3, "forwards": 6}, {"new_tokens": 6, "forwards": 6}]
