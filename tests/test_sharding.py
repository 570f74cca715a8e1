"""The program model's "is the model sharded, and what says so?" questions (lintdist.sharding)."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from lintdist.facts import PythonFacts
from lintdist.launch import LaunchSettings, Setting
from lintdist.names import NameResolver
from lintdist.sharding import (
    automatic_checkpoint_naming,
    builds_fsdp_plugin,
    fsdp_evidence,
    gathered_for_generation,
    launch_backend,
    parameter_sharding,
    sharded,
)
from lintdist.syntax import SyntaxIndex


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


def _settings(backend: str | None) -> LaunchSettings:
    settings = LaunchSettings()
    if backend is not None:
        settings.set(Setting("distributed_type", backend, "default_config.yaml", 1, 1, "yaml"))
    return settings


def _line(facts: PythonFacts):
    """A stand-in for the caller's line numbers: 3 for the node that reads ``DistributedType.FSDP``."""
    return lambda node: 3 if facts.index.module.code_for_node(node) == "DistributedType.FSDP" else 0


def test_launch_backend() -> None:
    assert launch_backend(None) is None
    assert launch_backend(_settings(None)) is None
    assert launch_backend(_settings("fsdp")) == "FSDP"
    assert launch_backend(_settings("MULTI_GPU")) == "MULTI_GPU"


@pytest.mark.parametrize(
    ("code", "backend", "expected"),
    [
        ("import accelerate\n", "DEEPSPEED", True),
        ("import accelerate\n", "FSDP", True),
        ("import accelerate\n", "MULTI_GPU", False),
        ("import accelerate\n", None, False),
        ("from accelerate import FullyShardedDataParallelPlugin as P\nplugin = P()\n", None, True),
        ("from accelerate.utils import DeepSpeedPlugin\nplugin = DeepSpeedPlugin(zero_stage=3)\n", None, True),
        ("from accelerate import Accelerator\naccelerator = Accelerator(deepspeed_plugin=plugin)\n", None, True),
        ("from accelerate import Accelerator\naccelerator = Accelerator(mixed_precision='bf16')\n", None, False),
        ("import deepspeed\nengine, *_ = deepspeed.initialize(model=m)\n", None, False),  # not a plugin
    ],
)
def test_sharded(code: str, backend: str | None, expected: bool) -> None:
    assert sharded(_facts(code), _settings(backend)) is expected


def test_fsdp_evidence_in_order_of_strength() -> None:
    tested = "from accelerate.utils import DistributedType\n\nif kind == DistributedType.FSDP:\n    pass\n"
    facts = _facts(tested)
    assert fsdp_evidence(facts, _settings("FSDP"), _line(facts)) == "the launch settings select FSDP"
    assert fsdp_evidence(facts, _settings(None), _line(facts)) == "the script tests `DistributedType.FSDP` at line 3"
    plugin = _facts("from accelerate import Accelerator\naccelerator = Accelerator(fsdp_plugin=plugin)\n")
    assert builds_fsdp_plugin(plugin)
    assert fsdp_evidence(plugin, None, _line(plugin)) == "the script builds an FSDP plugin"
    deepspeed = _facts("from accelerate import Accelerator\naccelerator = Accelerator(deepspeed_plugin=plugin)\n")
    assert not builds_fsdp_plugin(deepspeed)
    assert fsdp_evidence(deepspeed, _settings("DEEPSPEED"), _line(deepspeed)) is None
    # `FSDP` of another enum is no evidence
    other = _facts("from mylib import Backend\nif backend == Backend.FSDP:\n    pass\n")
    assert fsdp_evidence(other, None, _line(other)) is None


@pytest.mark.parametrize(
    ("argument", "expected"),
    [
        ("automatic_checkpoint_naming=True", True),
        ("automatic_checkpoint_naming=args.auto", True),
        ("automatic_checkpoint_naming=False", False),
        ("total_limit=3", False),
    ],
)
def test_automatic_checkpoint_naming(argument: str, expected: bool) -> None:
    facts = _facts(f"from accelerate.utils import ProjectConfiguration\nconfig = ProjectConfiguration({argument})\n")
    assert automatic_checkpoint_naming(facts) is expected


def test_deepspeed_placeholders_say_the_script_runs_deepspeed() -> None:
    from lintdist.sharding import builds_deepspeed_placeholders

    assert builds_deepspeed_placeholders(
        _facts("from accelerate.utils import DummyOptim\noptimizer = DummyOptim(model.parameters())\n")
    )
    assert not builds_deepspeed_placeholders(_facts("optimizer = DummyOptim(model.parameters())\n"))


@pytest.mark.parametrize(
    ("code", "backend", "kind", "method", "expected"),
    [
        ("", None, "always", "wait_for_everyone", True),
        ("", None, "sharded", "get_state_dict", False),
        ("", "FSDP", "sharded", "get_state_dict", True),
        ("", "MULTI_GPU", "sharded", "save_state", False),
        ("ProjectConfiguration(automatic_checkpoint_naming=True)", None, "sharded", "save_state", True),
        ("ProjectConfiguration(automatic_checkpoint_naming=True)", None, "sharded", "save_model", False),
    ],
)
def test_needs_every_rank(code: str, backend: str | None, kind: str, method: str, expected: bool) -> None:
    from lintdist.sharding import needs_every_rank

    source = f"from accelerate.utils import ProjectConfiguration\n{code}\n"
    assert needs_every_rank(_facts(source), _settings(backend), kind, method) is expected


@pytest.mark.parametrize(
    ("code", "backend", "kind", "method", "expected"),
    [
        ("", "DEEPSPEED", "always", "wait_for_everyone", False),  # every rank enters
        ("", None, "always", "gather", True),
        ("", None, "sharded", "save_state", False),  # nothing says FSDP: DDP saves locally
        ("", "FSDP", "sharded", "get_state_dict", True),
        ("", "MULTI_GPU", "sharded", "save_model", False),
        ("FullyShardedDataParallelPlugin()", None, "sharded", "save_model", True),
        ("ProjectConfiguration(automatic_checkpoint_naming=True)", "MULTI_GPU", "sharded", "save_state", True),
    ],
)
def test_hangs_under_main_or_deepspeed(code: str, backend: str | None, kind: str, method: str, expected: bool) -> None:
    from lintdist.sharding import hangs_under_main_or_deepspeed

    source = f"from accelerate.utils import FullyShardedDataParallelPlugin, ProjectConfiguration\n{code}\n"
    facts = _facts(source)
    assert hangs_under_main_or_deepspeed(facts, _settings(backend), kind, method, _line(facts)) is expected


@pytest.mark.parametrize(
    ("code", "backend", "expected"),
    [
        ("x = 1", "FSDP", (True, "the launch settings select FSDP")),
        ("x = 1", "MULTI_GPU", (False, "the launch settings select MULTI_GPU")),
        ("x = 1", None, (None, "")),
        (
            "from torch.distributed.fsdp import fully_shard\nfully_shard(model)",
            None,
            (True, "the script wraps the model with FSDP"),
        ),
        (
            "from torch.nn.parallel import DistributedDataParallel as DDP\nmodel = DDP(model)",
            None,
            (None, ""),
        ),
        ('cfg = {"zero_optimization": {"stage": 3}}', None, (True, "DeepSpeed runs with ZeRO stage 3")),
        ('cfg = {"zero_optimization": {"stage": 2}}', None, (False, "DeepSpeed runs with ZeRO stage 2")),
        (
            "from accelerate import Accelerator, DeepSpeedPlugin\nAccelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=3))",
            None,
            (True, "DeepSpeed runs with ZeRO stage 3"),
        ),
        (
            'from transformers import TrainingArguments\nTrainingArguments("out", fsdp="full_shard auto_wrap")',
            None,
            (True, '`TrainingArguments(fsdp="full_shard auto_wrap")` selects FSDP'),
        ),
        ('from transformers import TrainingArguments\nTrainingArguments("out", fsdp="")', None, (None, "")),
    ],
)
def test_parameter_sharding(code: str, backend: str | None, expected) -> None:
    assert parameter_sharding(_facts(code), _settings(backend)) == expected


def test_gathered_for_generation_inside_trl_context_unless_gathering_is_off() -> None:
    facts = _facts(
        """
        from trl.models import unwrap_model_for_generation
        with unwrap_model_for_generation(model, accelerator) as policy:
            policy.generate(x)
        with unwrap_model_for_generation(model, accelerator, gather_deepspeed3_params=False) as policy:
            policy.generate(y)
        model.generate(z)
        """
    )
    generates = [c for c in facts.calls if facts.method_name(c) == "generate"]
    assert [gathered_for_generation(facts, c) for c in generates] == [True, False, False]
