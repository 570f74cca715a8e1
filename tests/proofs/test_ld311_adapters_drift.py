"""LD311 proven on 2 gloo ranks: LoRA adapters added to a DDP model's `.module` after the wrap (as `get_peft_model`
does in place) are never averaged, so the ranks end with different adapters and nothing raises; the same adapters
added before the wrap stay equal on both ranks. peft is not a test dependency: the script's `inject_lora` does what
peft's `LoraModel._create_and_replace` does to an `nn.Linear` (see its docstring). No fix is offered, so the proof
runs the order LD311 reports and the order it asks for, and checks that LD311 reports the first."""

from __future__ import annotations

import json

import pytest

from tests.proofs.harness import SCRIPTS, run_ranks

pytestmark = pytest.mark.slow

LINT_AFTER = """\
from peft import LoraConfig, get_peft_model
from torch.nn.parallel import DistributedDataParallel

model = DistributedDataParallel(model)
model = get_peft_model(model, LoraConfig(r=2))
"""


def _equal_across_ranks(reports: list[dict]) -> bool:
    first, second = (r["adapters"] for r in reports)
    assert first and first.keys() == second.keys()
    return all(first[name] == second[name] for name in first)


def test_adapters_added_after_the_wrap_drift_apart(tmp_path, lintdist):
    script = tmp_path / "train.py"
    script.write_text(LINT_AFTER)
    result = lintdist("check", "--no-cache", "--select", "LD311", "--output-format", "json", str(script))
    assert [f["line"] for f in json.loads(result.output)] == [5]

    after = run_ranks(SCRIPTS / "ld311_lora_after_ddp.py", tmp_path / "after", args=("after",))
    before = run_ranks(SCRIPTS / "ld311_lora_after_ddp.py", tmp_path / "before", args=("before",))
    assert [r["error"] for r in after + before] == [None] * 4  # silent: no rank raises
    assert not _equal_across_ranks(after)
    assert _equal_across_ranks(before)
