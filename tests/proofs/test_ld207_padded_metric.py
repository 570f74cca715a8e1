"""LD207 proven by running it: 2 gloo ranks evaluate an 11-sample set through DistributedSampler (drop_last=False).
The all_reduced counts and the gathered per-sample hits score 12 samples (one twice) and differ from the
single-process float64 accuracy; the gathered hits interleaved in the sampler's order and cut to 11 equal it."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from lintdist.cli import cli
from tests.proofs.harness import SCRIPTS, run_ranks

pytestmark = pytest.mark.slow


def test_padded_duplicates_skew_the_metric_and_the_cut_removes_them(tmp_path):
    script = SCRIPTS / "ld207_padded_metric.py"
    result = CliRunner().invoke(
        cli, ["check", "--no-cache", "--select", "LD207", "--output-format", "concise", str(script)]
    )
    assert result.exit_code == 1, result.output
    assert result.output.count("LD207") == 3  # both all_reduce calls and the all_gather_object

    ranks = run_ranks(script, tmp_path / "out")
    report = ranks[0]
    assert report["world"] == 2
    assert report["reduced_total"] == 12.0 and report["gathered_count"] == 12  # 11 samples, one counted twice
    assert report["reference"] == pytest.approx(7 / 11)
    assert report["reduced"] != report["reference"]
    assert report["gathered"] != report["reference"]
    assert report["cut"] == report["reference"]
