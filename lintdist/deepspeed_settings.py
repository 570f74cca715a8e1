"""What DeepSpeed runs with, as the code's ``DeepSpeedPlugin(...)`` and the launch say: its ZeRO stage, its gradient
clipping, and where the script reads its accumulation steps."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import PythonFacts, argument_of
from lintdist.literals import is_name, mapping_entry
from lintdist.loop import DEEPSPEED_PLUGINS, integer_literal

# accelerate fills DeepSpeed's "auto" `gradient_clipping` with 1.0 (`_prepare_deepspeed`)
DEFAULT_CLIPPING = 1.0
DEEPSPEED_INITIALIZE = frozenset({"deepspeed.initialize"})
# `gradient_clipping` lintdist cannot read: a config file it cannot find, an expression of the launch
UNKNOWN = object()
# DeepSpeed's own default when its config writes no `gradient_clipping` (`GRADIENT_CLIPPING_DEFAULT`): no clipping
NO_CLIPPING = 0.0


def deepspeed_plugins(facts: PythonFacts) -> list[cst.Call]:
    """The ``DeepSpeedPlugin(...)`` calls of this file, in source order."""
    return [call for call in facts.calls if facts.callee_is(call, DEEPSPEED_PLUGINS)]


def runs_deepspeed(facts: PythonFacts, settings) -> bool:
    """DeepSpeed runs the script: the launch's backend says so, or the file builds a ``DeepSpeedPlugin``."""
    backend = settings.backend
    if backend is not None and str(backend.value).upper() == "DEEPSPEED":
        return True
    return bool(deepspeed_plugins(facts))


def zero_stage(facts: PythonFacts, settings) -> int | None:
    """The ZeRO stage: the first plugin's ``zero_stage=`` (2, its default, when it reads no config), else the launch's
    ``zero_stage``; None when unknown."""
    for call in deepspeed_plugins(facts):
        value = argument_of(call, "zero_stage", None)
        if value is not None:
            return integer_literal(value, facts, call)
        if argument_of(call, "hf_ds_config", None) is None and argument_of(call, "config_file", None) is None:
            return 2  # DeepSpeedPlugin's default (ACCELERATE_DEEPSPEED_ZERO_STAGE, else 2)
        return None
    setting = settings.get("zero_stage") if settings is not None else None
    value = str(setting.value).strip() if setting is not None else ""
    return int(value) if value.isdigit() else None


def gradient_clipping(facts: PythonFacts, settings, accelerated: bool):
    """The ``gradient_clipping`` DeepSpeed runs with: a float (read from the DeepSpeed config file the launch names
    too), the plugin's expression, or ``UNKNOWN`` (a config the code passes, a file lintdist cannot read, an
    expression, or no plugin and no Accelerator (``accelerated``) in sight)."""
    plugins = deepspeed_plugins(facts)
    for plugin in plugins:
        if any(a.star for a in plugin.args) or argument_of(plugin, "hf_ds_config", 0) is not None:
            return UNKNOWN
        value = argument_of(plugin, "gradient_clipping", None)
        if value is not None:
            return float(value.evaluated_value) if isinstance(value, (cst.Integer, cst.Float)) else value
    if settings is not None:
        file = settings.get("deepspeed_config_file")
        written = _file_clipping(file) if file is not None else None
        if written is not None and written != "auto":
            return written
        # no file, or a file that leaves it to accelerate: the launch's value, else accelerate's 1.0 for "auto"
        setting = settings.get("gradient_clipping")
        if setting is not None:
            try:
                return float(setting.value)
            except (TypeError, ValueError):
                return UNKNOWN
        if written == "auto":
            return DEFAULT_CLIPPING
    if not plugins and not accelerated:
        return UNKNOWN
    return DEFAULT_CLIPPING


def _file_clipping(file):
    """The ``gradient_clipping`` the DeepSpeed config file an accelerate config names writes (``file``, its
    ``deepspeed_config_file`` setting): its number, ``"auto"`` (accelerate fills it in), ``NO_CLIPPING`` when it
    writes none (accelerate fills only ``"auto"`` values), ``UNKNOWN`` when the file cannot be read or the value is
    neither."""
    from lintdist.deepspeed_files import ABSENT, named_deepspeed_config, top_value

    found = named_deepspeed_config(str(file.value), Path(file.path))
    value = top_value(found[1], "gradient_clipping") if found is not None else UNKNOWN
    if value is ABSENT:
        return NO_CLIPPING
    if value == "auto":
        return value
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else UNKNOWN


def reads_accumulation_steps(node: cst.CSTNode) -> bool:
    """``<...>.deepspeed_config["gradient_accumulation_steps"]`` or ``<...>.deepspeed_plugin.gradient_accumulation_steps``:
    the accumulation steps of the DeepSpeed config."""
    if isinstance(node, cst.Subscript) and len(node.slice) == 1:
        index = node.slice[0].slice
        key = (
            index.value.evaluated_value
            if isinstance(index, cst.Index) and isinstance(index.value, cst.SimpleString)
            else None
        )
        return key == "gradient_accumulation_steps" and "deepspeed" in (get_full_name_for_node(node.value) or "")
    if isinstance(node, cst.Attribute) and node.attr.value == "gradient_accumulation_steps":
        return "deepspeed" in (get_full_name_for_node(node.value) or "")
    return False


def literal_zero_stage(facts: PythonFacts) -> int | None:
    """The ZeRO stage of a DeepSpeed config the script writes as a literal (``{"zero_optimization": {"stage": 3}}``,
    ``dict(zero_optimization=dict(stage=3))``), the highest when several do; None when none says."""
    if "literal zero stage" not in facts._memo:
        configs = [*facts.index.nodes(cst.Dict), *(c for c in facts.calls if is_name(c.func, "dict"))]
        stages = [
            stage
            for config in configs
            if (section := mapping_entry(config, "zero_optimization")) is not None
            and (value := mapping_entry(section, "stage")) is not None
            and (stage := integer_literal(value, facts, value)) is not None
        ]
        facts._memo["literal zero stage"] = max(stages) if stages else None
    return facts._memo["literal zero stage"]


def deepspeed_engine(facts: PythonFacts, expr: cst.BaseExpression, at: cst.CSTNode) -> bool:
    """Whether ``expr``, or the module it is the ``.module`` of, can hold the engine ``deepspeed.initialize``
    returns (its first value)."""
    if isinstance(expr, cst.Attribute) and expr.attr.value == "module":
        expr = expr.value
    return any(
        isinstance(o.node, cst.Call) and o.index in (None, 0) and facts.callee_is(o.node, DEEPSPEED_INITIALIZE)
        for o in facts.origins(expr, at)
    )


def may_run_deepspeed(facts: PythonFacts, settings, launch) -> bool:
    """DeepSpeed may wrap the model instead of DDP: the ``deepspeed`` launcher starts the script (``launch``, the
    script's ``Launch``), accelerate's launch or a ``DeepSpeedPlugin`` selects it, a launch line passes the script
    ``--deepspeed`` (``train.py --deepspeed ds.json``), or the code passes a ``deepspeed=`` config
    (``TrainingArguments(deepspeed="ds.json")``) other than ``None``."""
    launcher = launch.launcher if launch is not None else None
    if launcher is not None and launcher.value == "deepspeed":
        return True
    if settings is not None and settings.get("script_deepspeed") is not None:
        return True
    if settings is not None and runs_deepspeed(facts, settings):
        return True
    given = [argument_of(call, "deepspeed", None) for call in facts.calls]
    return any(g is not None and not (isinstance(g, cst.Name) and g.value == "None") for g in given)


def engine_by_api(facts: PythonFacts, expr: cst.BaseExpression, at: cst.CSTNode) -> str | None:
    """Where ``expr`` (or the model it is the ``.module`` of) holds an engine that ``deepspeed.initialize`` made
    out of sight (in another module, handed over through an attribute or a parameter lintdist does not follow):
    the evidence, that it is used as one (``backward(loss)``, ``step()`` and ``.module`` together, which no
    other wrapper has); None where something in sight says what it holds, or its API does not."""
    if isinstance(expr, cst.Attribute) and expr.attr.value == "module":
        expr = expr.value
    if not isinstance(expr, (cst.Name, cst.Attribute)):
        return None
    if any(not isinstance(o.node, (cst.Param, cst.Name, cst.Attribute)) for o in facts.origins(expr, at)):
        return None  # made in sight (a call, a literal): what it is was decided there
    found = facts.used_as(expr, at)
    if found is None or found[0] != "deepspeed_engine" or not {"step", "module"} <= set(found[1]):
        return None
    used = ", ".join(f"`{attribute}`" for attribute in found[1])
    return f"`{get_full_name_for_node(expr)}` is used as a DeepSpeed engine: {used}"
