"""What a ``save_pretrained`` receiver is (lintdist.pretrained)."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.pretrained import pretrained_kind
from lintdist.syntax import SyntaxIndex


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


def test_pretrained_kind_by_origin_unwrap_and_name() -> None:
    facts = _facts(
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from peft import get_peft_model
        model = AutoModelForCausalLM.from_pretrained("gpt2")
        tok = AutoTokenizer.from_pretrained("gpt2")
        lora = get_peft_model(model, config)
        model.save_pretrained("a")
        tok.save_pretrained("b")
        lora.save_pretrained("c")
        accelerator.unwrap_model(lora).save_pretrained("d")
        image_processor.save_pretrained("e")
        peft_model.save_pretrained("f")
        unet.save_pretrained("g")
        """
    )
    saves = [c for c in facts.calls if facts.method_name(c) == "save_pretrained"]
    kinds = [pretrained_kind(facts, s.func.value, s) for s in saves]
    assert kinds == ["model", "other", "peft", "peft", "other", "peft", None]
