"""LD306 fsdp2-prepare-split: under FSDP2, `Accelerator.prepare` needs the model and its optimizer in one call.

accelerate 1.15's ``Accelerator.prepare`` counts, in each call, the arguments that are
``torch.nn.Module``s and ``torch.optim.Optimizer``s. Under FSDP2 (``is_fsdp2``) it raises
ValueError when one kind is present without the other, and when there is more than one
model; ``prepare_model`` raises for FSDP2 unless ``evaluation_mode=True``. The check is per
call, so a model prepared alone raises whether or not an optimizer follows in another call,
and so does a model that is only used for inference.
"""

from __future__ import annotations

import re

import libcst as cst

from lintdist.backends import accelerators_behind
from lintdist.facts import argument_of
from lintdist.fsdp import given_plugins, launched_fsdp
from lintdist.launch import setting_place
from lintdist.literals import is_name
from lintdist.model import Severity
from lintdist.object_kinds import ObjectKinds
from lintdist.rule import Invalid, Pattern, Rule, Valid


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
        self._kinds = ObjectKinds(self.loop)
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
        kinds = [None if arg.star else self._kinds.kind(arg.value, call) for arg in call.args if arg.keyword is None]
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

    # -- is FSDP2 in force? -------------------------------------------------------------------

    def _fsdp2(self, call: cst.Call) -> str | None:
        """Where FSDP2 comes from for the Accelerator behind ``call``, or None when it is not (surely) in force."""
        found = [self._accelerator_fsdp2(a) for a in accelerators_behind(self.facts, call.func.value, call)]
        return found[0] if all(found) else None

    def _accelerator_fsdp2(self, accelerator: cst.Call | None) -> str | None:
        if accelerator is None:
            return self._launched_fsdp2()
        if any(arg.star == "**" for arg in accelerator.args):
            return None
        cpu = argument_of(accelerator, "cpu", None)
        if cpu is not None and not is_name(cpu, "False"):
            return None  # `cpu=True` runs no FSDP (and an unreadable value may)
        if argument_of(accelerator, "deepspeed_plugin", None) or argument_of(accelerator, "deepspeed_plugins", None):
            return None  # DeepSpeed wins over FSDP in AcceleratorState
        plugins = given_plugins(self.facts, accelerator, self.context.settings, self.context.text)
        if plugins is None or any(p is not None and p[1] != 2 for p in plugins):
            return None
        launched = self._launched_fsdp2() if not plugins or None in plugins else ""  # the plugin from the launch
        if launched is None:
            return None
        if not plugins or plugins[0] is None:
            return launched
        plugin, _, setting = plugins[0]
        where = f", {setting_place(setting)}" if setting is not None else ""
        return f"the plugin at line {self.context.span(plugin).line}{where}"

    def _launched_fsdp2(self) -> str | None:
        """FSDP with ``fsdp_version: 2`` selected by the launch that runs this script (no plugin in code)."""
        launched = launched_fsdp(self.context.settings)
        return setting_place(launched[1]) if launched is not None and launched[0] == 2 else None

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
