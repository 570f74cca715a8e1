"""Which backend runs a model's gradients: whether FSDP is in force for an ``Accelerator`` or the HF
``Trainer``'s ``TrainingArguments``, and the evidence, in words for a message; whether the Trainer's
``accelerator_config`` syncs every micro-batch, and the config that does.

FSDP comes from the code (``Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(...))``,
``TrainingArguments(fsdp="full_shard")``) or from the launch (``distributed_type: FSDP``, ``--use_fsdp``,
``ACCELERATE_USE_FSDP=true``). Each answer is an ``Evidence`` or None: not known to be FSDP.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from lintdist.edits import keyword_arg
from lintdist.facts import ACCELERATOR_CLASSES, PythonFacts, argument_of
from lintdist.launch import written
from lintdist.layout import appended
from lintdist.literals import is_mapping_call, is_name, literal_truth, mapping_entry, readable_mapping
from lintdist.loop import FSDP_PLUGINS

TRAINING_ARGUMENTS = frozenset(
    {
        "transformers.TrainingArguments",
        "transformers.training_args.TrainingArguments",
        "transformers.Seq2SeqTrainingArguments",
        "transformers.training_args_seq2seq.Seq2SeqTrainingArguments",
    }
)
# TRL's trainer configs (`SFTConfig`, `DPOConfig`, `GRPOConfig`...) subclass TrainingArguments; `ModelConfig` does not.
TRL_NOT_TRAINING_ARGUMENTS = frozenset({"ModelConfig", "ScriptArguments"})


@dataclass(frozen=True)
class Evidence:
    """Why lintdist believes a backend is in force, in words for a message; ``{line}`` in ``template`` is the line
    of ``node``, filled in by ``describe`` only when a finding is reported (positions cost a printing pass)."""

    template: str
    node: cst.CSTNode | None = None

    def describe(self, span) -> str:
        """The evidence in words, ``span`` giving the line of its node (``FileContext.span``)."""
        return self.template.format(line=span(self.node).line if self.node is not None else 0)


def launch_fsdp(settings) -> Evidence | None:
    """Whether the launch settings (``LaunchSettings``, or None) select FSDP, and where they say so."""
    chosen = settings.backend if settings is not None else None
    if chosen is None or str(chosen.value).upper() != "FSDP":
        return None
    return Evidence(written(chosen).replace("{", "{{").replace("}", "}}"))


def built_from(facts: PythonFacts, value: cst.BaseExpression, at: cst.CSTNode, classes: frozenset[str]) -> bool:
    """Whether every value ``value`` can hold is a call of one of ``classes`` made in this module."""
    origins = facts.origins(value, at)
    return bool(origins) and all(
        isinstance(o.node, cst.Call) and o.index is None and facts.callee_is(o.node, classes) for o in origins
    )


def accelerators_behind(facts: PythonFacts, expr: cst.BaseExpression, at: cst.CSTNode) -> list[cst.Call | None]:
    """The ``Accelerator(...)`` calls an expression can hold; [the module's only one] or [None] when unknown."""
    found = [
        o.node
        for o in facts.origins(expr, at)
        if isinstance(o.node, cst.Call) and o.index is None and facts.callee_is(o.node, ACCELERATOR_CLASSES)
    ]
    if found:
        return list({id(c): c for c in found}.values())
    everywhere = facts.accelerator_constructions
    return [everywhere[0]] if len(everywhere) == 1 else [None]


def accelerator_fsdp(facts: PythonFacts, settings, accelerator: cst.Call | None) -> Evidence | None:
    """Whether an Accelerator (None: one out of sight) runs FSDP: a plugin it is always given, or the launch when
    the code picks nothing else (not the CPU, not DeepSpeed)."""
    if accelerator is not None:
        if is_name(argument_of(accelerator, "cpu", None), "True"):
            return None
        if any(argument_of(accelerator, k, None) is not None for k in ("deepspeed_plugin", "deepspeed_plugins")):
            return None
        plugin = argument_of(accelerator, "fsdp_plugin", None)
        if plugin is not None and built_from(facts, plugin, accelerator, FSDP_PLUGINS):
            return Evidence("the `Accelerator` at line {line} is given an FSDP plugin", accelerator)
    return launch_fsdp(settings)


def is_training_arguments(facts: PythonFacts, call: cst.Call) -> bool:
    """Whether ``call`` builds the HF Trainer's arguments (``TrainingArguments``, or a TRL trainer config)."""
    if facts.is_instance_of(call, TRAINING_ARGUMENTS):
        return True
    for name in facts.qualified_names(call.func):
        last = name.rsplit(".", 1)[-1]
        if name.startswith("trl.") and last.endswith("Config") and last not in TRL_NOT_TRAINING_ARGUMENTS:
            return True
    return False


def training_arguments_fsdp(facts: PythonFacts, settings, call: cst.Call) -> Evidence | None:
    """Whether a ``TrainingArguments(...)`` runs FSDP: a literal ``fsdp=`` that turns it on, else a launch that
    says FSDP (the Trainer's Accelerator reads ``ACCELERATE_USE_FSDP``). ``fsdp_config`` alone does nothing."""
    value = argument_of(call, "fsdp", None)
    if value is not None and literal_truth(value):
        code = facts.index.module.code_for_node(value).replace("{", "{{").replace("}", "}}")
        return Evidence(f"`fsdp={code}` at line {{line}}", value)
    return launch_fsdp(settings)


def accumulation_kwargs(config: cst.CSTNode) -> tuple[bool, cst.BaseExpression | None]:
    """The ``gradient_accumulation_kwargs`` of an ``accelerator_config`` value (a dict literal or
    ``AcceleratorConfig(...)``): (whether the config can be read, the value it gives them or None)."""
    if not (isinstance(config, cst.Dict) or is_mapping_call(config, "AcceleratorConfig")):
        return False, None
    if not readable_mapping(config):
        return False, None
    return True, mapping_entry(config, "gradient_accumulation_kwargs")


def sets_sync_each_batch(config: cst.CSTNode) -> bool | None:
    """Whether an ``accelerator_config`` value sets ``sync_each_batch`` (to any value: written out, it is the
    author's decision); None when it cannot be told from the literal."""
    readable, inner = accumulation_kwargs(config)
    if not readable:
        return None
    if inner is None or is_name(inner, "None"):
        return False
    if not isinstance(inner, cst.Dict) or not readable_mapping(inner):
        return None
    return mapping_entry(inner, "sync_each_batch") is not None


SYNC_EACH_BATCH = '{"sync_each_batch": True}'


def trainer_syncs_each_batch(facts: PythonFacts, call: cst.Call, mentioned: bool) -> bool:
    """Whether a ``TrainingArguments(...)`` call's ``accelerator_config`` sets ``sync_each_batch``, or is something
    lintdist cannot see into (a JSON file, a dict built elsewhere, ``**kwargs``) while ``mentioned`` (the file
    mentions ``sync_each_batch``). No ``accelerator_config``: no."""
    config = argument_of(call, "accelerator_config", None)
    if config is None:
        return any(arg.star == "**" for arg in call.args) and mentioned
    seen = [sets_sync_each_batch(o.node) for o in facts.origins(config, call)]
    if seen and all(value is not None for value in seen):
        return any(seen)
    return mentioned or isinstance(config, cst.SimpleString)


def with_sync_each_batch(config: cst.BaseExpression) -> cst.BaseExpression | None:
    """An ``accelerator_config`` value (a dict literal or ``AcceleratorConfig(...)``) with ``sync_each_batch: True``
    added to its ``gradient_accumulation_kwargs`` (or those added), laid out as the value is; None when lintdist
    cannot read it."""
    readable, kwargs = accumulation_kwargs(config)
    if not readable:
        return None
    if kwargs is None and isinstance(config, cst.Dict):
        element = cst.DictElement(
            key=cst.SimpleString('"gradient_accumulation_kwargs"'), value=cst.parse_expression(SYNC_EACH_BATCH)
        )
        return config.with_changes(elements=appended(config.elements, element, config.lbrace.whitespace_after))
    if kwargs is None:
        new = keyword_arg("gradient_accumulation_kwargs", cst.parse_expression(SYNC_EACH_BATCH))
        return config.with_changes(args=appended(config.args, new, config.whitespace_before_args))
    if not isinstance(kwargs, cst.Dict) or not readable_mapping(kwargs):
        return None
    sync = cst.DictElement(key=cst.SimpleString('"sync_each_batch"'), value=cst.Name("True"))
    elements = appended(kwargs.elements, sync, kwargs.lbrace.whitespace_after)
    return config.deep_replace(kwargs, kwargs.with_changes(elements=elements))
