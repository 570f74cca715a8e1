"""LD111 end to end: its unsafe fixes through the CLI, and what the installed transformers does with them.

tests/test_fixtures.py runs ``--fix`` only, which leaves LD111's unsafe fixes alone. Here each fixture with a
``*.unsafe.fixed.py`` is fixed with ``--unsafe-fixes`` and compared. Then a tiny ``LlamaForCausalLM`` shows the
two facts the rule rests on: pre-shifted ``labels`` alone give the next-next-token loss, and the same call with
``shift_labels=`` added (what the fix writes) gives the next-token loss.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import libcst as cst
import pytest
import torch
import torch.nn.functional as F

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "ld111"
FIXED = sorted(FIXTURES.glob("*.unsafe.fixed.py"))


def _source(fixed: Path) -> Path:
    return fixed.with_name(fixed.name.replace(".unsafe.fixed.py", ".py"))


@pytest.mark.parametrize("fixed", FIXED, ids=lambda p: p.name)
def test_unsafe_fix_gives_expected_output(fixed, tmp_path, lintdist):
    target = tmp_path / _source(fixed).name
    shutil.copy(_source(fixed), target)
    lintdist("check", "--fix", "--no-cache", "--select", "LD111", str(target))
    assert target.read_bytes() == _source(fixed).read_bytes(), "an unsafe fix must wait for --unsafe-fixes"
    lintdist("check", "--fix", "--unsafe-fixes", "--no-cache", "--select", "LD111", str(target))
    assert target.read_text() == fixed.read_text()
    cst.parse_module(target.read_text())
    after = lintdist("check", "--no-cache", "--select", "LD111", "--output-format", "json", str(target))
    assert json.loads(after.output) == [], "the fix removes every finding"


def test_fixtures_without_a_fix_say_why():
    """The Trainer and the prompt-tuned PEFT model get a diagnostic, and no fixed file."""
    for name in ("hf_trainer_collator", "peft_prompt_tuning"):
        assert (FIXTURES / f"{name}.expected").exists()
        assert not (FIXTURES / f"{name}.unsafe.fixed.py").exists()


def test_transformers_shifts_labels_and_takes_shift_labels():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=40,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 40, (2, 9))
    inputs, labels = ids[:, :-1], ids[:, 1:]
    with torch.no_grad():
        broken = model(input_ids=inputs, labels=labels)
        fixed = model(input_ids=inputs, labels=labels, shift_labels=labels.contiguous())
    logits = broken.logits.double()
    next_token = F.cross_entropy(logits.reshape(-1, 40), labels.reshape(-1))
    next_next = F.cross_entropy(logits[:, :-1].reshape(-1, 40), labels[:, 1:].reshape(-1))
    assert torch.isclose(fixed.loss.double(), next_token, atol=1e-5)
    assert torch.isclose(broken.loss.double(), next_next, atol=1e-5)
    assert not torch.isclose(next_token, next_next, atol=1e-3)
    # `ForCausalLMLoss` flattens `shift_labels` with `.view(-1)`: a bare slice fails, hence the fix's `.contiguous()`
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        model(input_ids=inputs, labels=labels, shift_labels=labels)
