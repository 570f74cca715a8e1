"""Whether FSDP is in force for an Accelerator or the Trainer's arguments, and the evidence
(lintdist/backends.py); how a fix names an imported class (lintdist/spelling.py ``imported_name``)."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from lintdist.backends import (
    accelerator_fsdp,
    accelerators_behind,
    accumulation_kwargs,
    built_from,
    is_training_arguments,
    launch_fsdp,
    sets_sync_each_batch,
    trainer_syncs_each_batch,
    training_arguments_fsdp,
    with_sync_each_batch,
)
from lintdist.facts import ACCELERATOR_CLASSES, PythonFacts
from lintdist.launch import LaunchSettings, Setting
from lintdist.names import NameResolver
from lintdist.spelling import imported_name
from lintdist.syntax import SyntaxIndex


def _facts(source: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(source)))
    return PythonFacts(index, NameResolver(index))


def _calls(facts: PythonFacts, name: str) -> list[cst.Call]:
    code = facts.index.module.code_for_node
    return [c for c in facts.index.nodes(cst.Call) if code(c.func).endswith(name)]


def _fsdp_launch() -> LaunchSettings:
    settings = LaunchSettings()
    settings.set(Setting("distributed_type", "FSDP", "config.yaml", 1, 1, "yaml", raw="distributed_type"))
    return settings


def _line(node):
    class Span:
        line = 7

    return Span()


def test_launch_fsdp_says_where():
    assert launch_fsdp(None) is None
    assert launch_fsdp(LaunchSettings()) is None
    evidence = launch_fsdp(_fsdp_launch())
    assert evidence.describe(_line) == "`distributed_type: FSDP` at config.yaml:1"


def test_accelerator_fsdp_from_the_plugin_the_cpu_deepspeed_or_the_launch():
    facts = _facts(
        """
        from accelerate import Accelerator, FullyShardedDataParallelPlugin, DeepSpeedPlugin

        sharded = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())
        maybe = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin() if big else None)
        on_cpu = Accelerator(cpu=True)
        deepspeed = Accelerator(deepspeed_plugin=DeepSpeedPlugin())
        plain = Accelerator()
        """
    )
    sharded, maybe, on_cpu, deepspeed, plain = _calls(facts, "Accelerator")
    evidence = accelerator_fsdp(facts, None, sharded)
    assert evidence.describe(_line) == "the `Accelerator` at line 7 is given an FSDP plugin"
    assert accelerator_fsdp(facts, None, maybe) is None
    assert accelerator_fsdp(facts, None, plain) is None
    launched = _fsdp_launch()
    assert accelerator_fsdp(facts, launched, plain) is not None
    assert accelerator_fsdp(facts, launched, None) is not None
    assert accelerator_fsdp(facts, launched, on_cpu) is None
    assert accelerator_fsdp(facts, launched, deepspeed) is None


def test_built_from_needs_every_origin():
    facts = _facts(
        """
        from accelerate import Accelerator
        a = Accelerator()
        b = Accelerator() if x else other
        use(a, b, c)
        """
    )
    use = _calls(facts, "use")[0]
    a, b, c = (arg.value for arg in use.args)
    assert built_from(facts, a, use, ACCELERATOR_CLASSES)
    assert not built_from(facts, b, use, ACCELERATOR_CLASSES)
    assert not built_from(facts, c, use, ACCELERATOR_CLASSES)


def test_accelerators_behind_falls_back_to_the_only_one():
    facts = _facts(
        """
        from accelerate import Accelerator
        accelerator = Accelerator()
        use(accelerator, self.accelerator)
        """
    )
    built = _calls(facts, "Accelerator")[0]
    use = _calls(facts, "use")[0]
    assert accelerators_behind(facts, use.args[0].value, use) == [built]
    assert accelerators_behind(facts, use.args[1].value, use) == [built]
    two = _facts("from accelerate import Accelerator\na = Accelerator()\nb = Accelerator()\nuse(c)\n")
    use = _calls(two, "use")[0]
    assert accelerators_behind(two, use.args[0].value, use) == [None]


def test_training_arguments_and_their_fsdp():
    facts = _facts(
        """
        from transformers import TrainingArguments
        from trl import SFTConfig, ModelConfig

        TrainingArguments(output_dir="out", fsdp="full_shard")
        SFTConfig(fsdp=args.fsdp)
        ModelConfig()
        TrainingArguments(output_dir="out", fsdp="")
        """
    )
    full, empty = _calls(facts, "TrainingArguments")
    sft, model = _calls(facts, "SFTConfig")[0], _calls(facts, "ModelConfig")[0]
    assert [is_training_arguments(facts, c) for c in (full, sft, model, empty)] == [True, True, False, True]
    assert training_arguments_fsdp(facts, None, full).describe(_line) == '`fsdp="full_shard"` at line 7'
    assert training_arguments_fsdp(facts, None, sft) is None
    assert training_arguments_fsdp(facts, _fsdp_launch(), sft) is not None
    assert training_arguments_fsdp(facts, None, empty) is None


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ('{"gradient_accumulation_kwargs": {"sync_each_batch": True}}', True),
        ('{"gradient_accumulation_kwargs": {"sync_each_batch": False}}', True),
        ('{"gradient_accumulation_kwargs": {"num_steps": 2}}', False),
        ('{"split_batches": True}', False),
        ('{"gradient_accumulation_kwargs": None}', False),
        ('{"gradient_accumulation_kwargs": kwargs}', None),
        ('{"gradient_accumulation_kwargs": {**kwargs}}', None),
        ("{**base}", None),
        ('AcceleratorConfig(gradient_accumulation_kwargs={"sync_each_batch": True})', True),
        ("AcceleratorConfig(split_batches=True)", False),
        ("AcceleratorConfig(**base)", None),
        ('"accelerator_config.json"', None),
    ],
)
def test_sets_sync_each_batch(text, answer):
    assert sets_sync_each_batch(cst.parse_expression(text)) is answer


def test_accumulation_kwargs_of_a_readable_config():
    readable, kwargs = accumulation_kwargs(cst.parse_expression('{"gradient_accumulation_kwargs": k}'))
    assert readable and isinstance(kwargs, cst.Name)
    assert accumulation_kwargs(cst.parse_expression("{}")) == (True, None)
    assert accumulation_kwargs(cst.parse_expression("config")) == (False, None)


def test_imported_name_keeps_an_alias_or_asks_for_an_import():
    plugin = frozenset({"accelerate.utils.GradientAccumulationPlugin"})
    fallback = ("accelerate.utils", "GradientAccumulationPlugin")
    aliased = _facts("from accelerate.utils import GradientAccumulationPlugin as GAP\n")
    assert imported_name(aliased, plugin, fallback) == ("GAP", ())
    missing = _facts("import accelerate\n")
    assert imported_name(missing, plugin, fallback) == ("GradientAccumulationPlugin", (fallback,))
    taken = _facts("GradientAccumulationPlugin = None\n")
    assert imported_name(taken, plugin, fallback) == (None, ())


@pytest.mark.parametrize(
    ("text", "fixed"),
    [
        (
            '{"split_batches": True}',
            '{"split_batches": True, "gradient_accumulation_kwargs": {"sync_each_batch": True}}',
        ),
        ("{}", '{"gradient_accumulation_kwargs": {"sync_each_batch": True}}'),
        (
            '{"gradient_accumulation_kwargs": {"num_steps": 2}}',
            '{"gradient_accumulation_kwargs": {"num_steps": 2, "sync_each_batch": True}}',
        ),
        (
            "AcceleratorConfig(split_batches=True)",
            'AcceleratorConfig(split_batches=True, gradient_accumulation_kwargs={"sync_each_batch": True})',
        ),
        ('{"gradient_accumulation_kwargs": kwargs}', None),
        ("{**base}", None),
        ('"accelerator_config.json"', None),
    ],
)
def test_with_sync_each_batch(text, fixed):
    new = with_sync_each_batch(cst.parse_expression(text))
    assert (cst.Module([]).code_for_node(new) if new is not None else None) == fixed


@pytest.mark.parametrize(
    ("arguments", "mentioned", "answer"),
    [
        ("fsdp=True", True, False),  # no accelerator_config
        ("**options", True, True),  # the unpacked options may hold one
        ("**options", False, False),
        ('accelerator_config={"gradient_accumulation_kwargs": {"sync_each_batch": False}}', False, True),
        ('accelerator_config={"split_batches": True}', True, False),  # read: it does not
        ("accelerator_config=config", True, True),  # out of sight, and the file mentions it
        ("accelerator_config=config", False, False),
        ('accelerator_config="accelerate.json"', False, True),
    ],
)
def test_trainer_syncs_each_batch(arguments, mentioned, answer):
    facts = _facts(f"from transformers import TrainingArguments\nargs = TrainingArguments({arguments})\n")
    call = facts.index.module.body[1].body[0].value
    assert trainer_syncs_each_batch(facts, call, mentioned) is answer
