"""Whether a transformers Trainer's DDP searches for unused parameters by default (lintdist/trainer_ddp.py)."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex
from lintdist.trainer_ddp import default_unused_search

HEAD = """
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import HfArgumentParser, Seq2SeqTrainer, Trainer, TrainingArguments
"""


def _search(source: str) -> str | None:
    index = SyntaxIndex(cst.parse_module(HEAD + textwrap.dedent(source)))
    facts = PythonFacts(index, NameResolver(index))
    found = [default_unused_search(facts, call) for call in facts.calls]
    return next((f for f in found if f is not None), None)


@pytest.mark.parametrize(
    "source",
    [
        # arguments in sight without the field
        """
        model = get_peft_model(base, LoraConfig(r=8))
        args = TrainingArguments("out", gradient_checkpointing=True)
        Trainer(model=model, args=args).train()
        """,
        # no arguments at all: the Trainer's own defaults
        """
        def main():
            model = PeftModel.from_pretrained(base, "adapter", is_trainable=True)
            Seq2SeqTrainer(model, train_dataset=ds).train()
        """,
        # a local subclass, arguments given inline
        """
        class MyTrainer(Trainer):
            pass

        model = get_peft_model(base, config)
        MyTrainer(model=model, args=TrainingArguments(output_dir="out")).train()
        """,
    ],
)
def test_code_leaves_the_search_on(source):
    assert _search(source) == "code"


@pytest.mark.parametrize(
    "source",
    [
        """
        finetune_args, training_args = HfArgumentParser((FinetuneArguments, TrainingArguments)).parse_args_into_dataclasses()
        model = get_peft_model(base, config)
        Trainer(model=model, args=training_args).train()
        """,
        """
        parser = HfArgumentParser((TrainingArguments,))
        (training_args,) = parser.parse_args_into_dataclasses()
        model = get_peft_model(base, config)
        Trainer(model=model, args=training_args).train()
        """,
    ],
)
def test_parsed_arguments_leave_it_to_the_command_line(source):
    assert _search(source) == "command line"


@pytest.mark.parametrize(
    "source",
    [
        # a transformers model: the Trainer turns the search off when it checkpoints
        """
        args = TrainingArguments("out")
        Trainer(model=base, args=args).train()
        """,
        # the field is set in the arguments or assigned later
        """
        model = get_peft_model(base, config)
        Trainer(model=model, args=TrainingArguments("out", ddp_find_unused_parameters=False)).train()
        """,
        """
        finetune_args, training_args = HfArgumentParser((FinetuneArguments, TrainingArguments)).parse_args_into_dataclasses()
        training_args.ddp_find_unused_parameters = False
        model = get_peft_model(base, config)
        Trainer(model=model, args=training_args).train()
        """,
        # DeepSpeed or FSDP: no DDP wrapper
        """
        model = get_peft_model(base, config)
        Trainer(model=model, args=TrainingArguments("out", deepspeed="ds.json")).train()
        """,
        # arguments lintdist cannot read
        """
        model = get_peft_model(base, config)
        Trainer(model=model, args=TrainingArguments(**settings)).train()
        """,
        """
        model = get_peft_model(base, config)
        Trainer(model=model, args=make_arguments()).train()
        """,
        # a subclass of TrainingArguments may change the default
        """
        model_args, training_args = HfArgumentParser((ModelArguments, MyTrainingArguments)).parse_args_into_dataclasses()
        model = get_peft_model(base, config)
        Trainer(model=model, args=training_args).train()
        """,
        # the model may be the base model on one branch
        """
        model = load()
        if use_lora:
            model = get_peft_model(model, config)
        Trainer(model=model, args=TrainingArguments("out")).train()
        """,
        # not a transformers Trainer
        """
        model = get_peft_model(base, config)
        MyTrainer(model=model, args=TrainingArguments("out")).fit()
        """,
    ],
)
def test_otherwise_unknown_or_off(source):
    assert _search(source) is None
