"""LD306 fsdp2-prepare-split: under FSDP2, `Accelerator.prepare` needs the model and its optimizer in one call.

accelerate 1.15's ``Accelerator.prepare`` counts, in each call, the arguments that are
``torch.nn.Module``s and ``torch.optim.Optimizer``s. Under FSDP2 (``is_fsdp2``) it raises
ValueError when one kind is present without the other, and when there is more than one
model; ``prepare_model`` raises for FSDP2 unless ``evaluation_mode=True``. The check is per
call, so a model prepared alone raises whether or not an optimizer follows in another call,
and so does a model that is only used for inference.
"""

from __future__ import annotations

import os
import re

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import ACCELERATOR_CLASSES, DATALOADER_CLASSES, argument_of
from lintdist.fsdp import PLUGIN_CLASSES, plugin_version
from lintdist.launch import launched_version
from lintdist.model import Severity
from lintdist.rule import Invalid, Pattern, Rule, Valid

MAX_DEPTH = 4
# What `prepare` receives besides models and optimizers.
SCHEDULER_HINTS = ("sched",)
LOADER_HINTS = ("loader", "dataloader")
# Names that say a value is a model, as written in training scripts (`model`, `ref_model`, `unet`...).
MODEL_NAMES = frozenset(
    {
        "model",
        "net",
        "network",
        "unet",
        "vae",
        "text_encoder",
        "transformer",
        "generator",
        "discriminator",
        "teacher",
        "student",
        "backbone",
        "critic",
    }
)
NOT_MODEL_SUFFIXES = ("_name", "_path", "_id", "_args", "_config", "_cfg", "_kwargs", "_type", "_dir", "_file")
# Calls that hand back the model they are given.
SAME_MODEL_METHODS = frozenset({"to", "cuda", "cpu", "train", "eval", "float", "half", "bfloat16", "requires_grad_"})
MODEL_FACTORIES = frozenset(
    {"torch.compile", "timm.create_model", "peft.get_peft_model", "peft.mapping.get_peft_model", "torchvision.models"}
)
# `torch.nn` names that are not modules.
NOT_MODULES = ("torch.nn.functional.", "torch.nn.utils.", "torch.nn.init.", "torch.nn.Parameter", "torch.nn.parameter.")
OPTIMIZER_FACTORIES = ("torch.optim.", "bitsandbytes.optim.", "transformers.optimization.", "apex.optimizers.")


class Fsdp2PrepareSplit(Rule):
    """
    ## What it does
    Reports an `accelerator.prepare(...)` call that, under FSDP2, passes a
    model without an optimizer, an optimizer without a model, or more than one
    model, and an `accelerator.prepare_model(model)` call without
    `evaluation_mode=True`. FSDP2 is in force when the `Accelerator` gets a
    `FullyShardedDataParallelPlugin(fsdp_version=2)` (or a plugin without a
    version, launched with `fsdp_version: 2`), or gets no plugin and is
    launched with FSDP and `fsdp_version: 2` (accelerate config, `accelerate
    launch` flags). Arguments are told apart by where they were built
    (`torch.optim.AdamW(...)`, `nn.Module` subclasses, `from_pretrained`) or by
    their names (`model`, `self.optimizer`, `train_dataloader`); a call with an
    argument lintdist cannot place is left alone.

    ## Why is this bad?
    Under FSDP2, `Accelerator.prepare` counts the models and optimizers of
    **each call** and raises `ValueError` ("a model and optimizer must be
    passed together") when one comes without the other: it shards the model
    with `fully_shard` and must then swap the optimizer's parameters for the
    sharded ones in the same call. So `model = accelerator.prepare(model)`
    followed by `optimizer = accelerator.prepare(optimizer)` crashes at the
    first line, and so does preparing a model used only for inference (a
    teacher, a reference model), which has no optimizer at all. More than one
    model in a call raises too ("Only one model is supported"), and
    `prepare_model(model)` raises unless `evaluation_mode=True`. DDP and FSDP1
    accept separate calls, so the error appears only when the job switches to
    FSDP2. (An `Accelerator` given a DeepSpeed plugin, or `cpu=True`, runs no
    FSDP and is not judged.)

    ## Example
    ```python
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap")
    accelerator = Accelerator(fsdp_plugin=plugin)
    model = accelerator.prepare(model)
    optimizer = accelerator.prepare(optimizer)
    ```

    ## Use instead
    ```python
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap")
    accelerator = Accelerator(fsdp_plugin=plugin)
    model, optimizer = accelerator.prepare(model, optimizer)
    ```
    Keep a model used only for inference out of `prepare`: move it to
    `accelerator.device`, or shard it yourself with `fully_shard`.

    ## Fix safety
    No fix: joining the calls moves code (the optimizer may be built from the
    prepared model's parameters, or between the calls), and an inference-only
    model needs a decision about sharding.

    ## References
    - accelerate `Accelerator.prepare` (the FSDP2 model and optimizer count) and `Accelerator._prepare_fsdp2`
      (`accelerate/accelerator.py`)
    - accelerate `Accelerator.prepare_model` ("FSDP2 preparation should be done via `accelerate.prepare()`")
    - [accelerate: FSDP1 vs FSDP2](https://huggingface.co/docs/accelerate/concept_guides/fsdp1_vs_fsdp2)
    """

    code = "LD306"
    name = "fsdp2-prepare-split"
    severity = Severity.ERROR
    fix_kind = "none"
    triggers = (Pattern(("prepare",), re.compile(r"prepare(?:_model)?\s*\(")),)
    also_triggers = (("accelerat", "Accelerat"),)  # an Accelerator's prepare, not any `prepare(`

    VALID = (
        Valid(
            """\
import torch
from accelerate import Accelerator, FullyShardedDataParallelPlugin

accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.AdamW(model.parameters())
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
"""
        ),
        Valid(
            """\
import torch
from accelerate import Accelerator, FullyShardedDataParallelPlugin

accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=1))
model = accelerator.prepare(torch.nn.Linear(4, 4))
optimizer = accelerator.prepare(torch.optim.AdamW(model.parameters()))
"""
        ),
        Valid(
            """\
import torch
from accelerate import Accelerator, FullyShardedDataParallelPlugin

accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
model, optimizer = accelerator.prepare(model, optimizer)
train_loader, scheduler = accelerator.prepare(train_loader, scheduler)
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
import torch
from accelerate import Accelerator, FullyShardedDataParallelPlugin

accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
model = torch.nn.Linear(4, 4)
model = accelerator.prepare(model)
optimizer = accelerator.prepare(torch.optim.AdamW(model.parameters()))
""",
            lines=(6, 7),
        ),
        Invalid(
            """\
from accelerate import Accelerator
from accelerate.utils import FullyShardedDataParallelPlugin


class Distiller:
    def __init__(self, student, teacher, optimizer):
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
        self.accelerator = Accelerator(fsdp_plugin=plugin)
        self.student, self.optimizer = self.accelerator.prepare(student, optimizer)
        self.teacher = self.accelerator.prepare(teacher)
""",
            lines=(10,),
        ),
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
model = accelerator.prepare(model)
""",
            lines=(4,),
            project={
                "config.yaml": "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n",
            },
        ),
    )

    def finish(self) -> None:
        facts = self.facts
        if "FullyShardedDataParallelPlugin" not in self.context.text and self._launched_fsdp2() is None:
            return  # neither the code nor the launch asks for FSDP2
        self._kinds: dict[int, str | None] = {}
        problems: list[tuple[cst.Call, str, str]] = []  # (call, what is wrong, the FSDP2 evidence)
        for call in facts.calls:
            method = facts.method_name(call)
            if method not in {"prepare", "prepare_model"} or not isinstance(call.func, cst.Attribute):
                continue
            if not facts.accelerator_like(call.func.value, call):
                continue
            where = self._fsdp2(call)
            if where is None:
                continue
            what = self._prepare_problem(call) if method == "prepare" else self._prepare_model_problem(call)
            if what is not None:
                problems.append((call, what, where))
        for call, what, where in problems:
            self.report(call, self._message(call, what, where, problems))

    # -- what a call passes --------------------------------------------------------------------

    def _prepare_problem(self, call: cst.Call) -> str | None:
        """ "model", "optimizer" or "models" when the call raises under FSDP2; None when it does not or lintdist
        cannot tell."""
        kinds = [None if arg.star else self._kind(arg.value, call) for arg in call.args if arg.keyword is None]
        models = kinds.count("model")
        if models > 1:
            return "models"  # raises whatever the other arguments are
        if None in kinds:
            return None
        optimizers = kinds.count("optimizer")
        if models and not optimizers:
            return "model"
        if optimizers and not models:
            return "optimizer"
        return None

    def _prepare_model_problem(self, call: cst.Call) -> str | None:
        model = argument_of(call, "model", 0)
        if model is None:
            return None
        evaluation = argument_of(call, "evaluation_mode", 2)
        if evaluation is not None and not (isinstance(evaluation, cst.Name) and evaluation.value == "False"):
            return None  # `evaluation_mode=True` (or a value lintdist cannot read) skips the FSDP2 branch
        earlier = self.loop.prepared_model(model, call)
        if (
            earlier is not None
            and earlier is not call
            and not self.facts.is_within(call, earlier)
            and not (self.facts.method_name(earlier) == "prepare" and self._prepare_problem(earlier))
        ):
            return None  # an already prepared model returns early; one whose `prepare` raised was never prepared
        return "prepare_model"

    def _kind(self, expr: cst.BaseExpression, at: cst.CSTNode, depth: int = 0) -> str | None:
        """ "model", "optimizer" or "other" (a loader, a scheduler...); None when lintdist cannot tell. Names
        decide first (`optimizer`, `train_loader`, `model`), then where the value was built."""
        key = id(expr)
        if key not in self._kinds:
            self._kinds[key] = None  # a value whose origin leads back to itself stays unknown
            self._kinds[key] = self._find_kind(expr, at, depth)
        return self._kinds[key]

    def _find_kind(self, expr: cst.BaseExpression, at: cst.CSTNode, depth: int) -> str | None:
        name = (get_full_name_for_node(expr) or "").rsplit(".", 1)[-1].lower()
        if any(hint in name for hint in LOADER_HINTS) or name in {"dl", "train_dl", "eval_dl", "val_dl"}:
            return "other"
        if _model_name(name):
            return "model"
        role = self.loop.role(expr, at)
        if role == "optimizer":
            return "optimizer"
        if role == "scheduler":
            return "other"
        return self._kind_by_origin(expr, at, depth)

    def _kind_by_origin(self, expr: cst.BaseExpression, at: cst.CSTNode, depth: int) -> str | None:
        if depth > MAX_DEPTH:
            return None
        facts = self.facts
        kinds: set[str | None] = set()
        for origin in facts.origins(expr, at):
            if len(kinds) > 1 or None in kinds:
                return None
            node = origin.node
            if not isinstance(node, cst.Call):
                kinds.add(None)
                continue
            if origin.index is not None:
                if self.loop.is_accelerate_prepare(node):  # `model, opt = accelerator.prepare(model, opt)`
                    argument = argument_of(node, "", origin.index)
                    kinds.add(self._kind(argument, node, depth + 1) if argument is not None else None)
                else:
                    kinds.add(None)
                continue
            kinds.add(self._call_kind(node, depth))
        return kinds.pop() if len(kinds) == 1 else None

    def _call_kind(self, call: cst.Call, depth: int) -> str | None:
        facts = self.facts
        if self.loop.is_accelerate_prepare(call):
            argument = argument_of(call, "", 0)
            return self._kind(argument, call, depth + 1) if argument is not None and len(call.args) == 1 else None
        method = facts.method_name(call)
        if isinstance(call.func, cst.Attribute) and method in SAME_MODEL_METHODS:
            return self._kind(call.func.value, call, depth + 1)
        if facts.is_instance_of(call, DATALOADER_CLASSES):
            return "other"
        names = facts.qualified_names(call.func) | {get_full_name_for_node(call.func) or ""}
        for qualified in names:
            if qualified.startswith(OPTIMIZER_FACTORIES) and "lr_scheduler" not in qualified:
                return "optimizer" if _class_like(qualified.rsplit(".", 1)[-1]) else None
            if qualified in MODEL_FACTORIES or qualified.startswith("torchvision.models."):
                return "model"
            parts = qualified.split(".")
            if parts[-1] in {"from_pretrained", "from_config"} and len(parts) > 1:
                parts = parts[:-1]
            last = parts[-1]
            if qualified.startswith("torch.nn.") and _class_like(last) and not qualified.startswith(NOT_MODULES):
                return "model"
            if parts[0] in {"transformers", "diffusers", "peft"} and _class_like(last) and _model_class(last):
                return "model"
        for cls in facts.classes:
            if cls.name.value == get_full_name_for_node(call.func) and facts.derives_from(
                cls,
                lambda n: n in {"torch.nn.Module", "torch.nn.modules.module.Module"} or n.startswith("transformers."),
            ):
                return "model"
        return None

    # -- is FSDP2 in force? -------------------------------------------------------------------

    def _fsdp2(self, call: cst.Call) -> str | None:
        """Where FSDP2 comes from for the Accelerator behind ``call``, or None when it is not (surely) in force."""
        facts = self.facts
        receiver = call.func.value
        accelerators = [
            o.node
            for o in facts.origins(receiver, call)
            if isinstance(o.node, cst.Call) and o.index is None and facts.callee_is(o.node, ACCELERATOR_CLASSES)
        ]
        if not accelerators:
            everywhere = [c for c in facts.calls if facts.callee_is(c, ACCELERATOR_CLASSES)]
            accelerators = everywhere if len(everywhere) == 1 else []
        if not accelerators:
            return self._launched_fsdp2()
        found = [self._accelerator_fsdp2(accelerator) for accelerator in accelerators]
        return found[0] if all(found) else None

    def _accelerator_fsdp2(self, accelerator: cst.Call) -> str | None:
        facts = self.facts
        if any(arg.star == "**" for arg in accelerator.args):
            return None
        cpu = argument_of(accelerator, "cpu", None)
        if cpu is not None and not (isinstance(cpu, cst.Name) and cpu.value == "False"):
            return None  # `cpu=True` runs no FSDP (and an unreadable value may)
        if argument_of(accelerator, "deepspeed_plugin", None) or argument_of(accelerator, "deepspeed_plugins", None):
            return None  # DeepSpeed wins over FSDP in AcceleratorState
        value = argument_of(accelerator, "fsdp_plugin", None)
        if value is None:
            return self._launched_fsdp2()
        wheres = []
        for origin in facts.origins(value, accelerator):
            node = origin.node
            if isinstance(node, cst.Name) and node.value == "None" and origin.index is None:
                wheres.append(None)  # the plugin then comes from the launch
                continue
            if origin.index is not None or not isinstance(node, cst.Call) or not facts.callee_is(node, PLUGIN_CLASSES):
                return None
            version, setting = plugin_version(facts, node, self.context.settings, self.context.text)
            if version != 2:
                return None
            line = self.context.span(node).line
            wheres.append(f"the plugin at line {line}" + (f", {_where(setting)}" if setting is not None else ""))
        if None in wheres:
            launched = self._launched_fsdp2()
            if launched is None:
                return None
            wheres = [w or launched for w in wheres]
        return wheres[0] if wheres else None

    def _launched_fsdp2(self) -> str | None:
        """FSDP with ``fsdp_version: 2`` selected by the launch that runs this script (no plugin in code)."""
        settings = self.context.settings
        backend = settings.distributed_type if settings is not None else None
        if backend is None or str(backend.value).upper() != "FSDP":
            return None
        setting = launched_version(settings)
        if setting is None or str(setting.value).strip() != "2":
            return None
        return _where(setting)

    # -- the message ----------------------------------------------------------------------------

    def _message(self, call: cst.Call, what: str, where: str, problems: list[tuple[cst.Call, str, str]]) -> str:
        origin = f"FSDP2 comes from {where}"
        if what == "prepare_model":
            return (
                f"`prepare_model()` raises ValueError under FSDP2 ({origin}): FSDP2 is set up only by `prepare()` "
                "with the model and its optimizer together; use `model, optimizer = accelerator.prepare(model, "
                "optimizer)`; for a model that is not trained, `evaluation_mode=True` avoids the error (the model is then "
                "neither sharded nor moved to the device)"
            )
        if what == "models":
            return (
                f"`prepare()` raises ValueError under FSDP2 ({origin}): only one model is supported per "
                "`Accelerator`; prepare each trained model with its optimizer in its own Accelerator, or "
                "keep inference-only models out of `prepare`"
            )
        partner = "optimizer" if what == "model" else "model"
        scope = self.facts.enclosing_class(call) or self.facts.enclosing_function(call)
        others = [
            self.context.span(other).line
            for other, other_what, _ in problems
            if other_what == partner
            and (self.facts.enclosing_class(other) or self.facts.enclosing_function(other)) is scope
        ]
        elsewhere = f" (its {partner} is prepared alone at line {others[0]})" if others else ""
        if what == "model":
            return (
                f"`prepare()` gets a model without its optimizer{elsewhere}: under FSDP2 ({origin}) it raises "
                "ValueError, because accelerate swaps the optimizer's parameters for the sharded ones in the same "
                "call; pass them together (`model, optimizer = accelerator.prepare(model, optimizer)`); a model used "
                "only for inference must stay out of `prepare` (move it to `accelerator.device`, or shard it with "
                "`fully_shard`)"
            )
        return (
            f"`prepare()` gets an optimizer without its model{elsewhere}: under FSDP2 ({origin}) it raises "
            "ValueError; pass the model and its optimizer in one call "
            "(`model, optimizer = accelerator.prepare(model, optimizer)`)"
        )


def _model_name(name: str) -> bool:
    if name.endswith(NOT_MODEL_SUFFIXES) or name.startswith(("num_", "n_")):
        return False
    return name in MODEL_NAMES or name.endswith(("model", "_net")) or name.startswith("model_")


def _model_class(name: str) -> bool:
    """A transformers/diffusers/peft model class: `LlamaForCausalLM`, `AutoModel`, `UNet2DConditionModel`."""
    return "Model" in name or "For" in name[1:] or name.startswith(("UNet", "Autoencoder"))


def _class_like(name: str) -> bool:
    return name[:1].isupper() and any(c.islower() for c in name)


def _where(setting) -> str:
    return f"{os.path.basename(setting.path)}:{setting.line}"
