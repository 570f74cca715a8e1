"""LD206 proven by running it: an IterableDataset that splits only across loader workers gives both gloo ranks
the same 16 rows; the one that slices by rank (which LD206 accepts) gives them disjoint halves of the 16."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from lintdist.cli import cli
from tests.proofs.harness import SCRIPTS, run_ranks

pytestmark = pytest.mark.slow

ROWS = 16


def _lint(name: str) -> int:
    result = CliRunner().invoke(cli, ["check", "--no-cache", "--select", "LD206", str(SCRIPTS / name)])
    return result.exit_code


def test_unsplit_stream_is_read_whole_by_every_rank(tmp_path):
    assert _lint("ld206_worker_only_stream.py") == 1
    assert _lint("ld206_rank_split_stream.py") == 0

    broken = run_ranks(SCRIPTS / "ld206_worker_only_stream.py", tmp_path / "out-broken")
    split = run_ranks(SCRIPTS / "ld206_rank_split_stream.py", tmp_path / "out-split")
    assert broken[0]["world"] == 2
    # Before: both ranks train on all 16 rows, in the same order.
    assert broken[0]["seen"] == broken[1]["seen"] == list(range(ROWS))
    # After: each rank reads its own half, and together they read every row once.
    halves = [set(r["seen"]) for r in split]
    assert halves[0].isdisjoint(halves[1])
    assert sorted(v for r in split for v in r["seen"]) == list(range(ROWS))
