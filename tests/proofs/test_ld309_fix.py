"""LD309 proven by running it: without a wrap policy FSDP2 keeps the whole model as one unit, with activation
checkpointing `prepare` raises TypeError on the line LD309 reports as an error, and `size_based_wrap` without
`min_num_params` behaves exactly like no policy; with a policy the blocks become units and are checkpointed.

Run on 2 gloo CPU ranks with torchrun (`ACCELERATE_USE_CPU=true`). What does not run on CPU: accelerate itself
never selects FSDP there (`AcceleratorState.__init__` switches to `DistributedType.FSDP` only in its multi-device
branch). The scripts import `ld306_fsdp_on_cpu`, which makes that one switch after the real `__init__`; from
there on `Accelerator.prepare`, `_prepare_fsdp2`, `set_auto_wrap_policy`, `fsdp2_apply_ac`,
`fsdp2_prepare_model` and `fully_shard` are accelerate's and torch's own code, unpatched. FSDP1 through accelerate
does not run on CPU at all (`FullyShardedDataParallel` rejects the `device_id=cpu:0` accelerate passes), so its
no-wrap and activation-checkpointing behaviour is verified in the source only. Each script is linted beside a
`torchrun` launch line (the launch that runs it exports no `FSDP_*` variable), as LD309 needs the launch in sight.
"""

from __future__ import annotations

import itertools
import json
import shutil

import pytest

from tests.proofs.harness import SCRIPTS, run_ranks

pytestmark = pytest.mark.slow


def _findings(lintdist, tmp_path, name: str) -> list[tuple[int, str]]:
    """(line, severity) of LD309 on the script, linted in a folder with the torchrun line that runs it."""
    folder = tmp_path / "lint" / name.removesuffix(".py")
    folder.mkdir(parents=True)
    shutil.copy(SCRIPTS / name, folder / name)
    (folder / "launch.sh").write_text(f"torchrun --standalone --nproc_per_node 2 {name}\n")
    result = lintdist("check", "--no-cache", "--select", "LD309", "--output-format", "json", str(folder / name))
    return [(f["line"], f["severity"]) for f in json.loads(result.output) if f["code"] == "LD309"]


def _run(tmp_path, monkeypatch, name: str) -> list[dict]:
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    reports = run_ranks(SCRIPTS / name, tmp_path / name.removesuffix(".py"))
    assert all(report["distributed_type"] == "DistributedType.FSDP" for report in reports)
    return reports


@pytest.mark.parametrize("name", ["ld309_ac_without_policy.py", "ld309_size_without_min_ac.py"])
def test_checkpointing_without_policy_raises_at_prepare(tmp_path, monkeypatch, lintdist, name):
    findings = _findings(lintdist, tmp_path, name)
    assert len(findings) == 1 and findings[0][1] == "error"
    plugin_line = findings[0][0]
    for report in _run(tmp_path, monkeypatch, name):
        failure = report["failure"]
        assert failure["error"] == "TypeError"
        assert failure["message"] == "'NoneType' object is not callable"
        assert failure["line"] > plugin_line  # the `prepare` call of the reported plugin


@pytest.mark.parametrize("name", ["ld309_no_policy.py", "ld309_size_without_min.py"])
def test_no_policy_leaves_one_unit(tmp_path, monkeypatch, lintdist, name):
    findings = _findings(lintdist, tmp_path, name)
    assert len(findings) == 1 and findings[0][1] == "warning"
    for report in _run(tmp_path, monkeypatch, name):
        assert report["fsdp_units"] == ["<root>"]  # nothing but the root is sharded on its own
        assert report["checkpointed"] == []
        assert report["losses"][-1] < report["losses"][0]  # it trains: the cost is memory, not correctness


def test_policy_shards_and_checkpoints_each_block(tmp_path, monkeypatch, lintdist):
    name = "ld309_with_policy.py"
    assert _findings(lintdist, tmp_path, name) == []
    blocks = [f"blocks.{i}" for i in range(4)]
    for report in _run(tmp_path, monkeypatch, name):
        assert set(blocks) <= set(report["fsdp_units"])
        assert report["checkpointed"] == blocks
        losses = report["losses"]
        assert all(later < earlier for earlier, later in itertools.pairwise(losses))
