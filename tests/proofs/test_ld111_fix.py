"""LD111 proven by running it: a tiny LlamaForCausalLM given pre-shifted labels learns the token after next;
after --fix --unsafe-fixes its loss is the next-token cross-entropy."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from tests.proofs.harness import SCRIPTS, fixed_copy, run_ranks

pytestmark = pytest.mark.slow

SCRIPT = "ld111_shifted_twice.py"


def _script_module():
    spec = importlib.util.spec_from_file_location("ld111_shifted_twice", SCRIPTS / SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _losses_by_hand(step: dict) -> tuple[float, float]:
    """Float64, from the same initial weights: (next-token loss, next-next-token loss) of one batch."""
    script = _script_module()
    model = script.build_model().double().eval()
    input_ids, labels = torch.tensor(step["input_ids"]), torch.tensor(step["labels"])
    with torch.no_grad():
        logits = model(input_ids=input_ids).logits
    # labels[:, t] is the token after input_ids[:, t]: the target of position t
    next_token = F.cross_entropy(logits.reshape(-1, script.VOCAB), labels.reshape(-1))
    # what the model does with labels it shifts again: position t scored against labels[:, t + 1]
    next_next = F.cross_entropy(logits[:, :-1].reshape(-1, script.VOCAB), labels[:, 1:].reshape(-1))
    return next_token.item(), next_next.item()


def test_fixed_call_trains_next_token_prediction(tmp_path):
    broken, fixed = fixed_copy(SCRIPT, tmp_path, codes="LD111", unsafe=True)
    assert 'outputs = model(**batch, shift_labels=batch["labels"].contiguous())' in fixed.read_text()

    for label, script in (("broken", broken), ("fixed", fixed)):
        ranks = run_ranks(script, tmp_path / f"out-{label}")
        assert [r["world"] for r in ranks] == [2, 2]
        # the two ranks trained on different halves of the windows
        assert ranks[0]["steps"][0]["input_ids"] != ranks[1]["steps"][0]["input_ids"]
        for report in ranks:
            step = report["steps"][0]
            next_token, next_next = _losses_by_hand(step)
            assert abs(next_token - next_next) > 1e-3
            expected = next_token if label == "fixed" else next_next
            assert step["loss"] == pytest.approx(expected, abs=1e-5), (label, step["loss"], next_token, next_next)
