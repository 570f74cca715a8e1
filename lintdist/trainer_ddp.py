"""How a transformers ``Trainer`` builds its DDP wrapper when the code does not say: whether it searches for unused
parameters by default.

transformers ``Trainer`` (4.x ``_wrap_model``; 5.24 ``_build_accelerator_args``) gives DDP
``find_unused_parameters=args.ddp_find_unused_parameters`` when that field is set; when it is None (the default) it
gives ``not model.is_gradient_checkpointing`` for a ``PreTrainedModel`` and True for any other model. A peft
``PeftModel`` (``class PeftModel(PushToHubMixin, torch.nn.Module)``) is no ``PreTrainedModel``, so a Trainer handed
``get_peft_model(...)`` searches for unused parameters unless the arguments say otherwise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from lintdist.backends import TRAINING_ARGUMENTS
from lintdist.bindings import attribute_assignments
from lintdist.facts import argument_of
from lintdist.pretrained import PEFT_MAKERS
from lintdist.reaching import reaching_bindings

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts

TRAINERS = frozenset(
    {
        "transformers.Trainer",
        "transformers.trainer.Trainer",
        "transformers.Seq2SeqTrainer",
        "transformers.trainer_seq2seq.Seq2SeqTrainer",
    }
)
# Fields that make the Trainer build no DDP wrapper (DeepSpeed's engine, FSDP) or decide the search themselves.
DECIDING_FIELDS = ("ddp_find_unused_parameters", "deepspeed", "fsdp", "fsdp_config")
PARSE = "parse_args_into_dataclasses"
PARSERS = frozenset({"transformers.HfArgumentParser", "transformers.hf_argparser.HfArgumentParser"})


def default_unused_search(facts: PythonFacts, call: cst.Call) -> str | None:
    """For a transformers ``Trainer(...)`` (or ``Seq2SeqTrainer``, or a local subclass) call whose model is a PEFT
    model (``get_peft_model``/``PeftModel.from_pretrained`` is the only value its name can hold there): "code" when
    its DDP will search for unused parameters because the arguments leave ``ddp_find_unused_parameters`` unset (no
    ``args``, or a ``TrainingArguments(...)`` in sight without the field), "command line" when the arguments come
    from ``HfArgumentParser(...).parse_args_into_dataclasses()`` (a ``--ddp_find_unused_parameters`` option may still
    set it). None otherwise: another or unknown model, the field assigned anywhere in the file, arguments lintdist
    cannot read (``**kwargs``, a config class), or ones that select DeepSpeed or FSDP."""
    if not (facts.method_name(call) or "").endswith("Trainer") or not facts.is_instance_of(call, TRAINERS):
        return None
    model = argument_of(call, "model", 0)
    if not isinstance(model, cst.Name) or not _peft_model(facts, model.value, call):
        return None
    if attribute_assignments(facts, DECIDING_FIELDS):
        return None
    given = argument_of(call, "args", 1)
    if given is None:
        return "code"  # the Trainer makes TrainingArguments(output_dir="tmp_trainer"): every field at its default
    source = given
    if isinstance(given, cst.Name):
        bindings, before = reaching_bindings(facts, given.value, call)
        if before or len(bindings) != 1:
            return None
        source = bindings[0].value
        if bindings[0].index is not None:
            return "command line" if _parsed_training_arguments(facts, source, bindings[0].index) else None
    if not isinstance(source, cst.Call) or not facts.is_instance_of(source, TRAINING_ARGUMENTS):
        return None
    if any(arg.star for arg in source.args) or any(argument_of(source, f, None) is not None for f in DECIDING_FIELDS):
        return None
    return "code"


def _peft_model(facts: PythonFacts, name: str, at: cst.CSTNode) -> bool:
    """Every assignment of ``name`` that may reach ``at`` makes a PEFT model, and nothing from before them does."""
    bindings, before = reaching_bindings(facts, name, at)
    return (
        bool(bindings)
        and not before
        and all(
            b.index is None and isinstance(b.value, cst.Call) and facts.callee_is(b.value, PEFT_MAKERS)
            for b in bindings
        )
    )


def _parsed_training_arguments(facts: PythonFacts, source: cst.BaseExpression, index: int) -> bool:
    """``source`` is ``HfArgumentParser((..., TrainingArguments, ...)).parse_args_into_dataclasses()`` (the parser
    made there or bound to a name) and element ``index`` of its result is transformers' own ``TrainingArguments``
    (a subclass may change the field's default)."""
    if not (
        isinstance(source, cst.Call) and isinstance(source.func, cst.Attribute) and facts.method_name(source) == PARSE
    ):
        return False
    parser = source.func.value
    if isinstance(parser, cst.Name):
        bindings, before = reaching_bindings(facts, parser.value, source)
        if before or len(bindings) != 1:
            return False
        parser = bindings[0].value
    if not isinstance(parser, cst.Call) or not facts.is_instance_of(parser, PARSERS) or not parser.args:
        return False
    given = parser.args[0].value
    classes = [e.value for e in given.elements] if isinstance(given, (cst.Tuple, cst.List)) else [given]
    return index < len(classes) and not TRAINING_ARGUMENTS.isdisjoint(facts.qualified_names(classes[index]))
