"""LD306 proven by running it: every `prepare` call LD306 reports raises ValueError under FSDP2, on the line
reported, and the version that passes the model with its optimizer in one call shards and trains.

Run on 2 gloo CPU ranks with torchrun (`ACCELERATE_USE_CPU=true`, so accelerate builds its gloo MULTI_CPU
state). What does not run on CPU: accelerate itself never selects FSDP there. `PartialState._prepare_backend`
gives MULTI_CPU (or NO) on a CPU, and `AcceleratorState.__init__` switches to `DistributedType.FSDP` only in
its multi-device branch (MULTI_GPU, MULTI_XPU...). The scripts import `ld306_fsdp_on_cpu`, which does, right
after the real `AcceleratorState.__init__`, the two assignments that branch makes for a plugin
(`distributed_type = FSDP`, `fsdp_plugin = plugin`). From there on everything is accelerate's and torch's own
code, unpatched: `Accelerator.prepare` with its FSDP2 model/optimizer count, `prepare_model`, `_prepare_fsdp2`,
`fsdp2_prepare_model` and `fully_shard` on the gloo group. No fix is offered, so the proof compares the
reported lines with the lines that raise, and runs the joined version written by hand.
"""

from __future__ import annotations

import itertools
import json

import pytest

from tests.proofs.harness import SCRIPTS, run_ranks

pytestmark = pytest.mark.slow


def _reported(lintdist, script, code: str) -> list[int]:
    result = lintdist("check", "--no-cache", "--select", code, "--output-format", "json", str(script))
    return sorted(f["line"] for f in json.loads(result.output) if f["code"] == code)


def test_every_reported_prepare_raises(tmp_path, monkeypatch, lintdist):
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    script = SCRIPTS / "ld306_split_prepare.py"
    reported = _reported(lintdist, script, "LD306")
    assert len(reported) == 4  # model alone, optimizer alone, inference-only teacher alone, prepare_model

    for report in run_ranks(script, tmp_path / "split"):
        assert report["distributed_type"] == "DistributedType.FSDP"
        failures = report["failures"]
        assert [f["line"] for f in failures] == reported
        assert {f["error"] for f in failures} == {"ValueError"}
        messages = [f["message"] for f in failures]
        assert sum("a model and optimizer must be passed together" in m for m in messages) == 3
        assert "FSDP2 preparation should be done via `accelerate.prepare()`" in messages[3]


def test_joined_prepare_shards_and_trains(tmp_path, monkeypatch, lintdist):
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    script = SCRIPTS / "ld306_joined_prepare.py"
    assert _reported(lintdist, script, "LD306") == []

    for report in run_ranks(script, tmp_path / "joined"):
        assert report["distributed_type"] == "DistributedType.FSDP"
        assert report["fsdp_units"] == ["<root>", "blocks.0", "blocks.1", "blocks.2", "blocks.3"]
        losses = report["losses"]
        assert all(later < earlier for earlier, later in itertools.pairwise(losses))
        assert report["teacher_rows"] == 2
