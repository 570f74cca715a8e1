"""LD410 proven by running it: accelerate's gather of generated sequences of different lengths per rank fails
(gloo: "Received data size doesn't match expected size"); padded across processes first, every rank gathers every
row. The rule has no fix (the pad value must be chosen), so the padded copy is written here and must be clean."""

from __future__ import annotations

import shutil

import pytest
from click.testing import CliRunner

from lintdist.cli import cli
from tests.proofs.harness import SCRIPTS, run_ranks
from tests.proofs.test_ld402_fix import _broken_launch

pytestmark = pytest.mark.slow

GATHER = "gathered = accelerator.gather_for_metrics(tokens)\n"
PADDED = "tokens = accelerator.pad_across_processes(tokens, dim=1, pad_index=0)\n" + GATHER


def _lint(path) -> int:
    return CliRunner().invoke(cli, ["check", "--no-cache", "--select", "LD410", str(path)]).exit_code


def test_gathering_unpadded_sequences_fails_and_padding_them_works(tmp_path, monkeypatch):
    broken = tmp_path / "broken" / "ld410_uneven_gather.py"
    padded = tmp_path / "padded" / "ld410_uneven_gather.py"
    for target in (broken, padded):
        target.parent.mkdir()
        shutil.copy(SCRIPTS / broken.name, target)
    text = broken.read_text()
    assert GATHER in text
    padded.write_text(text.replace(GATHER, PADDED))
    assert _lint(broken) == 1, "the unpadded gather must be reported"
    assert _lint(padded) == 0, "the padded gather must be clean"

    # Broken: rank 0 holds 2 x 4 tokens and rank 1 2 x 7. Rank 0 aborts (gloo: "Received data size doesn't match
    # expected size"); rank 1 may come back with rank 0's rows stretched to 7 columns, the last 3 being whatever its
    # uninitialised buffer held: wrong data, silently.
    returncode, output, reports = _broken_launch(broken, tmp_path / "out-broken", monkeypatch)
    assert returncode != 0, "the unpadded gather must not finish cleanly"
    assert "size" in output, f"gloo must refuse the mismatched sizes:\n{output[-4000:]}"
    assert 0 not in reports, "rank 0 must not finish the gather"
    if 1 in reports:
        assert all(len(row) == 7 for row in reports[1]["gathered"][:2]), "rank 0 sent 4 columns, not 7"

    # Padded: every rank gets both ranks' rows, rank 0's padded with 0 to 7 tokens.
    ranks = run_ranks(padded, tmp_path / "out-padded")
    expected = [[1, 5, 5, 5, 0, 0, 0]] * 2 + [[1, 6, 6, 6, 6, 6, 6]] * 2
    assert [report["gathered"] for report in ranks] == [expected, expected]
