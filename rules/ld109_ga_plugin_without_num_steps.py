"""LD109 ga-plugin-without-num-steps: a `GradientAccumulationPlugin` that silently accumulates over one step."""

from __future__ import annotations

import re

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.deepspeed_settings import runs_deepspeed
from lintdist.edits import with_keyword, without_argument
from lintdist.facts import ACCELERATOR_CLASSES, argument_of
from lintdist.in_sight import holds_value, named_value_in_sight
from lintdist.loop import GA_PLUGIN_CLASSES
from lintdist.model import Applicability, Fix, Severity
from lintdist.receivers import receiving_calls
from lintdist.rule import Invalid, Rule, Valid

# Names of a gradient-accumulation count (`gradient_accumulation_steps`, `grad_accum_steps`, `accum_iter`...):
# a count, not a flag, so bare `gradient_accumulation` is left out.
GA_NAME = re.compile(
    r"(?:gradient_accumulation|grad(?:ient)?_accum(?:ulation)?|accum(?:ulation)?|ga)_(?:steps|iters?)"
    r"|grad_accum|accumulate_grad_batches",
    re.IGNORECASE,
)


class GaPluginWithoutNumSteps(Rule):
    """
    ## What it does
    Reports `GradientAccumulationPlugin(...)` built without `num_steps` (or
    with `num_steps=None`), unless `num_steps` may come in through
    `**kwargs`, the script sets `plugin.num_steps` or
    `accelerator.gradient_accumulation_steps` afterwards, or it edits the
    gradient state's `plugin_kwargs` itself.

    ## Why is this bad?
    `num_steps` defaults to `None`, and `GradientState` keeps only
    `plugin.to_kwargs()`, the fields that differ from their defaults; its
    `num_steps` then reads `plugin_kwargs.get("num_steps", 1)`. So a plugin
    built only for `sync_each_batch=True` or `sync_with_dataloader=False`
    accumulates over **one** step: `accelerator.accumulate()` syncs and steps
    the optimizer on every batch and `accelerator.backward` divides by 1,
    with no error or warning. (`adjust_scheduler` reads False for the same
    reason.) `Accelerator` reads `ACCELERATE_GRADIENT_ACCUMULATION_STEPS` only
    when no plugin is given, and passing `gradient_accumulation_steps=` beside
    the plugin raises ValueError. Under DeepSpeed, `prepare` replaces the count
    with the DeepSpeed config's (unless that is `auto`), so there it is a
    warning.

    ## Example
    ```python
    plugin = GradientAccumulationPlugin(sync_each_batch=True)
    accelerator = Accelerator(gradient_accumulation_plugin=plugin)
    ```

    ## Use instead
    ```python
    plugin = GradientAccumulationPlugin(num_steps=args.gradient_accumulation_steps, sync_each_batch=True)
    accelerator = Accelerator(gradient_accumulation_plugin=plugin)
    ```

    ## Fix safety
    Safe, and offered only when the count is in sight: a
    `gradient_accumulation_steps=` passed to the same `Accelerator` (it moves
    into the plugin, where it is not an error), or else exactly one variable
    with a gradient-accumulation name (`gradient_accumulation_steps`,
    `grad_accum_steps`, `accum_iter`...) visible at the plugin: a parameter of
    the enclosing functions, a variable assigned before the plugin on every
    path to it, or a module variable; or else an attribute such as
    `args.gradient_accumulation_steps` of an argparse namespace that the
    file's parser fills (an `add_argument("--gradient_accumulation_steps")` or
    `"--gradient-accumulation-steps"`, and `args` from `parse_args()` or
    `parse_known_args()[0]`). The fix adds `num_steps=<that>` as the first
    argument. Otherwise the finding has no fix: the intended count is unknown.

    ## References
    - accelerate `accelerate/utils/dataclasses.py`: `GradientAccumulationPlugin`,
      `KwargsHandler.to_kwargs`
    - accelerate `accelerate/state.py`: `GradientState.num_steps` (`plugin_kwargs.get("num_steps", 1)`)
    - accelerate `Accelerator.__init__` (the plugin and `gradient_accumulation_steps` are exclusive)
    """

    code = "LD109"
    name = "ga-plugin-without-num-steps"
    severity = Severity.ERROR
    fix_kind = "safe"
    triggers = ("GradientAccumulationPlugin",)

    VALID = (
        Valid(
            """\
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin

plugin = GradientAccumulationPlugin(num_steps=4, sync_each_batch=True)
accelerator = Accelerator(gradient_accumulation_plugin=plugin)
"""
        ),
        Valid(
            """\
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin

plugin = GradientAccumulationPlugin(**plugin_options)
accelerator = Accelerator(gradient_accumulation_plugin=plugin)
"""
        ),
        Valid(
            """\
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin

accelerator = Accelerator(gradient_accumulation_plugin=GradientAccumulationPlugin(sync_with_dataloader=False))
accelerator.gradient_accumulation_steps = 8
"""
        ),
        Valid(
            """\
from accelerate.utils import GradientAccumulationPlugin

plugin = GradientAccumulationPlugin(sync_each_batch=True)
plugin.num_steps = config.accumulation
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
import argparse

from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin


def main(args):
    plugin = GradientAccumulationPlugin(sync_each_batch=True)
    accelerator = Accelerator(gradient_accumulation_plugin=plugin)


parser = argparse.ArgumentParser()
parser.add_argument("--gradient-accumulation-steps", type=int, default=4)
main(parser.parse_args())
""",
            lines=(8,),
            fixed="""\
import argparse

from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin


def main(args):
    plugin = GradientAccumulationPlugin(num_steps=args.gradient_accumulation_steps, sync_each_batch=True)
    accelerator = Accelerator(gradient_accumulation_plugin=plugin)


parser = argparse.ArgumentParser()
parser.add_argument("--gradient-accumulation-steps", type=int, default=4)
main(parser.parse_args())
""",
        ),
        Invalid(
            """\
import accelerate.utils as au
from accelerate import Accelerator

GRAD_ACCUM_STEPS = 8


def build_accelerator():
    return Accelerator(
        mixed_precision="bf16",
        gradient_accumulation_plugin=au.GradientAccumulationPlugin(
            sync_with_dataloader=False,
        ),
    )
""",
            lines=(10,),
            fixed="""\
import accelerate.utils as au
from accelerate import Accelerator

GRAD_ACCUM_STEPS = 8


def build_accelerator():
    return Accelerator(
        mixed_precision="bf16",
        gradient_accumulation_plugin=au.GradientAccumulationPlugin(
            num_steps=GRAD_ACCUM_STEPS,
            sync_with_dataloader=False,
        ),
    )
""",
        ),
        Invalid(
            """\
from accelerate import Accelerator, utils

accelerator = Accelerator(
    gradient_accumulation_steps=4,
    gradient_accumulation_plugin=utils.GradientAccumulationPlugin(sync_each_batch=True),
)
""",
            lines=(5,),
            fixed="""\
from accelerate import Accelerator, utils

accelerator = Accelerator(
    gradient_accumulation_plugin=utils.GradientAccumulationPlugin(num_steps=4, sync_each_batch=True),
)
""",
        ),
        Invalid(
            """\
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin

if args.ga > 1:
    gradient_accumulation_steps = args.ga
plugin = GradientAccumulationPlugin(num_steps=None, adjust_scheduler=False)
accelerator = Accelerator(gradient_accumulation_plugin=plugin)
""",
            lines=(6,),
        ),
    )

    def finish(self) -> None:
        facts = self.facts
        for call in facts.calls:
            if not facts.callee_is(call, GA_PLUGIN_CLASSES) or any(arg.star for arg in call.args):
                continue
            given = argument_of(call, "num_steps", 0)
            if given is not None and not (isinstance(given, cst.Name) and given.value == "None"):
                continue
            if self._set_elsewhere(call):
                continue
            self._report(call, given)

    def _set_elsewhere(self, plugin: cst.Call) -> bool:
        """``plugin.num_steps = n`` or ``accelerator.gradient_accumulation_steps = n`` (a setter that writes
        the gradient state's ``num_steps``), or the script edits ``plugin_kwargs`` itself."""
        facts = self.facts
        if "plugin_kwargs" in self.context.text:
            return True
        statement = facts.parent(plugin)
        if isinstance(statement, cst.Assign) and statement.value is plugin:
            for target in statement.targets:
                key = get_full_name_for_node(target.target)
                if key and facts.bindings(f"{key}.num_steps", plugin):
                    return True
        for assign, target in self.loop.accumulation_setters:
            receiver = get_full_name_for_node(target.value) or ""
            if facts.is_accelerator(target.value, assign) or receiver.endswith("accelerator"):
                return True
        return False

    # -- the report and its fix -------------------------------------------------------------

    def _report(self, plugin: cst.Call, given: cst.BaseExpression | None) -> None:
        accelerators = receiving_calls(self.facts, plugin, ACCELERATOR_CLASSES, "gradient_accumulation_plugin")
        both = [
            (call, arg)
            for call, _ in accelerators
            for arg in call.args
            if arg.keyword is not None
            and arg.keyword.value == "gradient_accumulation_steps"
            and not (isinstance(arg.value, cst.Integer) and arg.value.evaluated_value == 1)
        ]
        spelled = "`num_steps=None`" if given is not None else "no `num_steps`"
        deepspeed = runs_deepspeed(self.facts, self.settings)
        message = (
            f"`GradientAccumulationPlugin` with {spelled} accumulates over 1 step: `GradientState` keeps only the "
            "fields that differ from their defaults and reads `num_steps` as 1, so every batch syncs and steps "
            "the optimizer"
        )
        if both:
            message += (
                "; and `Accelerator` raises ValueError when it gets `gradient_accumulation_steps` beside the plugin: "
                "pass the count as the plugin's `num_steps` only"
            )
        elif deepspeed:
            launched = self.context.settings.get("gradient_accumulation_steps") if self.context.settings else None
            count = f" ({launched.value})" if launched is not None else ""
            message += (
                f"; under DeepSpeed, `prepare` replaces it with the DeepSpeed config's count{count}, and an `auto` "
                "count there becomes this 1: pass `num_steps=<gradient accumulation steps>`"
            )
        else:
            message += "; pass `num_steps=<gradient accumulation steps>`"
        fix = self._fix(plugin, given, both)
        self.report(plugin, message, fix=fix, severity=Severity.WARNING if deepspeed else None)

    def _fix(
        self, plugin: cst.Call, given: cst.BaseExpression | None, both: list[tuple[cst.Call, cst.Arg]]
    ) -> Fix | None:
        module = self.context.module
        if both:
            if len(both) != 1:
                return None
            accelerator, arg = both[0]
            count = arg.value
            literal = isinstance(count, (cst.Integer, cst.Name, cst.Attribute)) and (
                isinstance(count, cst.Integer)
                or holds_value(self.facts, get_full_name_for_node(count).split(".")[0], plugin)
            )
            if not literal or not any(a.value is plugin for a in accelerator.args):
                return None
            new_plugin = _with_num_steps(plugin, given, count)
            new_accelerator = without_argument(accelerator, arg)
            if new_accelerator is None:
                return None
            new_accelerator = _swap(new_accelerator, plugin, new_plugin)
            return Fix(
                Applicability.SAFE,
                f"Move `gradient_accumulation_steps={module.code_for_node(count)}` into the plugin as `num_steps`",
                replacements=((accelerator, new_accelerator),),
            )
        count_text = named_value_in_sight(self.facts, plugin, GA_NAME)
        if count_text is None:
            return None
        return Fix(
            Applicability.SAFE,
            f"Pass `num_steps={count_text}`",
            replacements=((plugin, _with_num_steps(plugin, given, cst.parse_expression(count_text))),),
        )


def _with_num_steps(plugin: cst.Call, given: cst.BaseExpression | None, count: cst.BaseExpression) -> cst.Call:
    """The plugin call with ``num_steps=count`` (replacing ``None``, else as the first argument)."""
    if given is None:
        return with_keyword(plugin, "num_steps", count)
    return _swap(plugin, given, count)


def _swap(call: cst.Call, old: cst.BaseExpression, new: cst.BaseExpression) -> cst.Call:
    """``call`` with its argument ``old`` (a direct argument value) replaced by ``new``."""
    return call.with_changes(args=[arg.with_changes(value=new) if arg.value is old else arg for arg in call.args])
