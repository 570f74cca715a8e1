"""LD109 ga-plugin-without-num-steps: a `GradientAccumulationPlugin` that silently accumulates over one step."""

from __future__ import annotations

import re

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.edits import without_argument
from lintdist.facts import ACCELERATOR_CLASSES, argument_of
from lintdist.loop import DEEPSPEED_PLUGINS, GA_PLUGIN_CLASSES
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Rule, Valid

# Names of a gradient-accumulation count (`gradient_accumulation_steps`, `grad_accum_steps`, `accum_iter`...):
# a count, not a flag, so bare `gradient_accumulation` is left out.
GA_NAME = re.compile(
    r"(?:gradient_accumulation|grad(?:ient)?_accum(?:ulation)?|accum(?:ulation)?|ga)_(?:steps|iters?)"
    r"|grad_accum|accumulate_grad_batches",
    re.IGNORECASE,
)
PARSE_METHODS = {"parse_args": None, "parse_known_args": 0}  # method -> index of the namespace in its result
# Compound statements that always run their body once reached; any other one may skip it.
ALWAYS_RUN = (cst.With, cst.FunctionDef, cst.ClassDef)
SEQUENTIAL = (cst.IndentedBlock, cst.Module, cst.SimpleStatementLine, cst.SimpleStatementSuite)


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

    # -- the count in sight -------------------------------------------------------------------

    def _accelerators(self, plugin: cst.Call) -> list[cst.Call]:
        """The ``Accelerator(...)`` calls this plugin reaches through ``gradient_accumulation_plugin=``."""
        facts = self.facts
        found = []
        for call in facts.calls:
            if not facts.callee_is(call, ACCELERATOR_CLASSES):
                continue
            given = argument_of(call, "gradient_accumulation_plugin", None)
            if given is not None and any(o.node is plugin for o in facts.origins(given, call)):
                found.append(call)
        return found

    def _count_in_sight(self, plugin: cst.Call) -> str | None:
        """Source text of the one gradient-accumulation count visible at the plugin, or None."""
        names = sorted({name for name in self._ga_names() if self._visible(name, plugin)})
        if len(names) == 1:
            return names[0]
        if names:
            return None  # two candidates: which one was meant is not ours to guess
        attributes = sorted(self._namespace_counts(plugin))
        return attributes[0] if len(attributes) == 1 else None

    def _ga_names(self) -> set[str]:
        """Variables and parameters of the file named like a gradient-accumulation count."""
        facts = self.facts
        names = {
            name.value
            for name in facts.index.nodes(cst.Name)
            if GA_NAME.fullmatch(name.value) and not isinstance(facts.parent(name), cst.Attribute)
        }
        return {n for n in names if not self._flag(n)}

    def _flag(self, name: str) -> bool:
        """Some assignment gives the name a boolean: it says whether to accumulate, not how much."""
        return any(
            isinstance(assign.value, cst.Name)
            and assign.value.value in {"True", "False"}
            and any(isinstance(t.target, cst.Name) and t.target.value == name for t in assign.targets)
            for assign in self.facts.index.nodes(cst.Assign)
        )

    def _visible(self, name: str, at: cst.CSTNode) -> bool:
        """``name`` holds a value wherever ``at`` runs: a parameter of an enclosing function, a variable the
        function assigns before ``at`` on every path to it, or (when the function does not assign it) one of
        an enclosing function or of the module; at module level, a variable assigned before ``at``."""
        facts = self.facts
        point: cst.CSTNode = at
        function = facts.enclosing_function(at)
        while True:
            if function is not None and facts.parameter(name, point) is not None:
                return True
            local = [
                b
                for b in facts.bindings(name, point)
                if b.function is function and facts.enclosing_class(b.statement) is None
            ]
            if local:
                if function is None and point is not at:
                    return True  # a module variable read from a function: set by the time it runs
                return any(self._before_on_every_path(b.statement, point) for b in local)
            if function is None:
                return False
            point, function = function, facts.enclosing_function(function)

    def _before_on_every_path(self, statement: cst.CSTNode, at: cst.CSTNode) -> bool:
        facts = self.facts
        if facts.index.order(statement) >= facts.index.order(at):
            return False
        for ancestor in facts.ancestors(statement):
            if facts.is_within(at, ancestor):
                return isinstance(ancestor, SEQUENTIAL)
            if isinstance(ancestor, cst.BaseCompoundStatement) and not isinstance(ancestor, ALWAYS_RUN):
                return False
        return False

    def _namespace_counts(self, plugin: cst.Call) -> set[str]:
        """``args.<dest>`` for an argparse option with a gradient-accumulation name, where ``args`` is visible
        at the plugin and holds what the file's parser parsed."""
        facts = self.facts
        dests = self._ga_options()
        if not dests:
            return set()
        namespaces = {
            node.value.value
            for node in facts.index.nodes(cst.Attribute)
            if isinstance(node.value, cst.Name) and node.attr.value in dests
        }
        function = facts.enclosing_function(plugin)
        while function is not None:  # the parameters of the enclosing functions (`def main(args)`)
            namespaces |= {p.name.value for p in (*function.params.posonly_params, *function.params.params)}
            function = facts.enclosing_function(function)
        for call in facts.calls:
            if facts.method_name(call) in PARSE_METHODS:
                statement = facts.parent(call)
                if not isinstance(statement, cst.Assign):
                    continue
                target = statement.targets[0].target
                index = PARSE_METHODS[facts.method_name(call)]
                if index is not None and isinstance(target, (cst.Tuple, cst.List)) and target.elements:
                    target = target.elements[index].value
                if isinstance(target, cst.Name):
                    namespaces.add(target.value)
        found = set()
        for namespace in namespaces:
            if not self._visible(namespace, plugin) or not self._parsed(namespace, plugin):
                continue
            found |= {f"{namespace}.{dest}" for dest in dests}
        return found

    def _parsed(self, namespace: str, at: cst.CSTNode) -> bool:
        """Every value the name can hold there is a namespace from ``parse_args()``/``parse_known_args()[0]``."""
        origins = self.facts.origins(cst.Name(namespace), at)
        return bool(origins) and all(
            isinstance(o.node, cst.Call)
            and self.facts.method_name(o.node) in PARSE_METHODS
            and PARSE_METHODS[self.facts.method_name(o.node)] == o.index
            for o in origins
        )

    def _ga_options(self) -> set[str]:
        """The ``dest`` of each ``add_argument`` whose name says gradient accumulation."""
        facts = self.facts
        dests = set()
        for call in facts.calls:
            if facts.method_name(call) != "add_argument":
                continue
            flags = [
                a.value.evaluated_value
                for a in call.args
                if a.keyword is None and isinstance(a.value, cst.SimpleString) and not a.star
            ]
            dest_arg = argument_of(call, "dest", None)
            if isinstance(dest_arg, cst.SimpleString):
                dest = dest_arg.evaluated_value
            else:
                long = [f for f in flags if isinstance(f, str) and f.startswith("--")]
                chosen = long[0][2:] if long else (flags[0].lstrip("-") if flags and isinstance(flags[0], str) else "")
                dest = chosen.replace("-", "_")
            if GA_NAME.fullmatch(dest or ""):
                dests.add(dest)
        return dests

    # -- the report and its fix -------------------------------------------------------------

    def _report(self, plugin: cst.Call, given: cst.BaseExpression | None) -> None:
        accelerators = self._accelerators(plugin)
        both = [
            (call, arg)
            for call in accelerators
            for arg in call.args
            if arg.keyword is not None
            and arg.keyword.value == "gradient_accumulation_steps"
            and not (isinstance(arg.value, cst.Integer) and arg.value.evaluated_value == 1)
        ]
        spelled = "`num_steps=None`" if given is not None else "no `num_steps`"
        deepspeed = self._deepspeed()
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

    def _deepspeed(self) -> bool:
        """DeepSpeed runs the script: its config's accumulation count overrides the plugin's at ``prepare``."""
        facts = self.facts
        backend = self.settings.backend
        if backend is not None and str(backend.value).upper() == "DEEPSPEED":
            return True
        # a DeepSpeed plugin built anywhere here (an `Accelerator(deepspeed_plugin=...)` is the backend above)
        return any(facts.callee_is(call, DEEPSPEED_PLUGINS) for call in facts.calls)

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
                isinstance(count, cst.Integer) or self._visible(get_full_name_for_node(count).split(".")[0], plugin)
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
        count_text = self._count_in_sight(plugin)
        if count_text is None:
            return None
        return Fix(
            Applicability.SAFE,
            f"Pass `num_steps={count_text}`",
            replacements=((plugin, _with_num_steps(plugin, given, cst.parse_expression(count_text))),),
        )


def _with_num_steps(plugin: cst.Call, given: cst.BaseExpression | None, count: cst.BaseExpression) -> cst.Call:
    """The plugin call with ``num_steps=count`` (replacing ``None``, else as the first argument)."""
    if given is not None:
        return plugin.with_changes(
            args=[arg.with_changes(value=count) if arg.value is given else arg for arg in plugin.args]
        )
    layout = plugin.whitespace_before_args
    if not plugin.args:
        return plugin.with_changes(args=[cst.Arg(keyword=cst.Name("num_steps"), value=count, equal=_EQUAL)])
    separator = layout if isinstance(layout, cst.ParenthesizedWhitespace) else cst.SimpleWhitespace(" ")
    first = cst.Arg(
        keyword=cst.Name("num_steps"), value=count, equal=_EQUAL, comma=cst.Comma(whitespace_after=separator)
    )
    return plugin.with_changes(args=[first, *plugin.args])


_EQUAL = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))


def _swap(call: cst.Call, old: cst.Call, new: cst.Call) -> cst.Call:
    """``call`` with its argument ``old`` (a direct argument value) replaced by ``new``."""
    return call.with_changes(args=[arg.with_changes(value=new) if arg.value is old else arg for arg in call.args])
