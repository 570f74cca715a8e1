"""What FSDP2 makes of FSDP1 options: which ones accelerate 1.15 ignores or rejects under ``fsdp_version: 2``, and
the FSDP2 form of each, as ``accelerate to-fsdp2`` writes it.

Read in accelerate's ``FullyShardedDataParallelPlugin.__post_init__``, ``prepare_multi_gpu_env`` and
``convert_config_to_fsdp2``. A verdict carries its explanation in words, for a message, and the repair that makes the
option valid under FSDP2; one rule reports the verdicts and another converts a whole file with the same repairs, so
the two never disagree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import libcst as cst

from lintdist.facts import PythonFacts, argument_of
from lintdist.fsdp import (
    FSDP1_CPU_OFFLOAD,
    FSDP1_MIXED_PRECISION,
    FSDP1_OPTION_CLASSES,
    is_local_state_dict,
    strategy_name,
)
from lintdist.launch import Setting, edit_setting
from lintdist.literals import is_name
from lintdist.model import Severity, TextEdit
from lintdist.values import enum_member, known_value, parses_as_bool, python_value, shell_expansion

# The FSDP2 equivalent of each strategy, as `accelerate to-fsdp2` maps it.
RESHARD_FOR = {
    "FULL_SHARD": True,
    "SHARD_GRAD_OP": False,
    "NO_SHARD": False,
    "HYBRID_SHARD": True,
    "HYBRID_SHARD_ZERO2": False,
}
# Launch-side options (normalised to the flag name) that FSDP2 ignores, and why.
IGNORED_LAUNCH_OPTIONS = {
    "fsdp_use_orig_params": "FSDP2 always trains the original parameters",
    "fsdp_sync_module_states": "FSDP2 has no module-state sync; with `cpu_ram_efficient_loading` accelerate "
    "broadcasts rank 0's weights itself",
    "fsdp_backward_prefetch": "accelerate resets it to None under FSDP2, which prefetches on its own",
    "fsdp_forward_prefetch": "accelerate has no forward prefetch for FSDP2",
}
# Plugin keywords that FSDP2 ignores, and why.
IGNORED_PLUGIN_OPTIONS = {
    "use_orig_params": "accelerate logs a warning and drops it: FSDP2 always trains the original parameters",
    "sync_module_states": "accelerate logs a warning and drops it: FSDP2 has no module-state sync",
    "limit_all_gathers": "`fully_shard` has no such option and accelerate never passes it",
    "param_init_fn": "accelerate's FSDP2 path never calls it",
    "backward_prefetch": "accelerate logs a warning and resets it to None",
}
# Plugin keywords valid under FSDP1 with values FSDP2 rejects: unread, they may make a converted plugin raise.
VALUE_CHECKED_OPTIONS = frozenset(
    {"reshard_after_forward", "mixed_precision_policy", "cpu_offload", "sharding_strategy"}
)
LOCAL_STATE_DICT = (
    "is LOCAL_STATE_DICT, which FSDP2 does not support: accelerate raises ValueError; "
    "use SHARDED_STATE_DICT or FULL_STATE_DICT"
)


def _no_prefetch(value: object) -> bool:
    return isinstance(value, str) and value.upper() == "NO_PREFETCH"  # the FSDP2 behaviour already


# -- launch-side options (YAML keys, flags, environment variables) -----------------------------


@dataclass(frozen=True)
class Problem:
    """One launch-side option that is wrong under FSDP2, and how to repair it.

    ``remove`` deletes the option; ``value`` sets a new boolean value, under the
    name ``rename`` when given (a sharding strategy becomes ``reshard_after_forward``).
    Neither: no repair. ``safe`` is False when the repair changes what runs today
    (an ignored ``SHARD_GRAD_OP`` becoming ``reshard_after_forward: false``).
    ``certain`` is False when the value is a shell expansion (``$RESHARD``) that may be fine.
    """

    name: str
    severity: Severity
    message: str
    remove: bool = False
    value: bool | None = None
    rename: str | None = None
    safe: bool = True
    certain: bool = True

    @property
    def fixable(self) -> bool:
        return self.remove or self.value is not None


def judge_launch_options(options: dict[str, object], written: Callable[[str], str], *, yaml: bool) -> list[Problem]:
    """The launch-side options (normalised name -> value) that are wrong under FSDP2; ``written(name)`` spells an
    option as its file does, and ``yaml`` says the values are YAML scalars (``$X`` literal, booleans booleans)."""
    problems = []
    for name, value in options.items():
        option = f"`{written(name)}`"
        if name in IGNORED_LAUNCH_OPTIONS:
            if name == "fsdp_backward_prefetch" and _no_prefetch(str(value).strip()):
                continue
            # `cpu_ram_efficient_loading` absent means the launcher's default string "true"
            if (
                name == "fsdp_sync_module_states"
                and yaml
                and value is False
                and options.get("fsdp_cpu_ram_efficient_loading", "true")
            ):
                message = (
                    f"{option} is false while `cpu_ram_efficient_loading` is on: `accelerate launch` raises "
                    "ValueError (the check runs under FSDP2 too, where the key is otherwise ignored); remove the key"
                )
                problems.append(Problem(name, Severity.ERROR, message, remove=True))
                continue
            message = f"{option} is ignored under FSDP2 ({IGNORED_LAUNCH_OPTIONS[name]}); remove it"
            problems.append(Problem(name, Severity.WARNING, message, remove=True))
        elif name == "fsdp_sharding_strategy":
            problems.append(_launch_strategy(name, option, value, "fsdp_reshard_after_forward" in options))
        elif name == "fsdp_reshard_after_forward" and not parses_as_bool(value):
            if not yaml and shell_expansion(value):
                message = f"{option} comes from the shell; FSDP2 needs a boolean"
                problems.append(Problem(name, Severity.ERROR, message, certain=False))
                continue
            strategy = strategy_name(value)
            advice = f"use {str(RESHARD_FOR[strategy]).lower()}" if strategy else "use true or false"
            message = (
                f"{option} is an FSDP1 sharding strategy; FSDP2 needs a boolean and accelerate raises ValueError "
                f"('invalid truth value'); {advice}"
            )
            problems.append(Problem(name, Severity.ERROR, message, value=RESHARD_FOR[strategy] if strategy else None))
        elif name == "fsdp_state_dict_type" and is_local_state_dict(value):
            problems.append(Problem(name, Severity.ERROR, f"{option} {LOCAL_STATE_DICT}"))
    return problems


def _launch_strategy(name: str, option: str, value: object, has_reshard: bool) -> Problem:
    strategy = strategy_name(value)
    if has_reshard:
        message = f"{option} is ignored under FSDP2, where `reshard_after_forward` decides; remove it"
        return Problem(name, Severity.WARNING, message, remove=True)
    if strategy is None:
        message = f"{option} is ignored under FSDP2; set `reshard_after_forward` (true or false) instead"
        return Problem(name, Severity.WARNING, message)
    reshard = RESHARD_FOR[strategy]
    effect = "runs as a full reshard after forward" if not reshard else "has no effect"
    message = (
        f"{option} is ignored under FSDP2 and `reshard_after_forward` defaults to true, so `{strategy}` "
        f"{effect}; replace it with `reshard_after_forward` {str(reshard).lower()}"
    )
    # Mapping to true keeps today's behaviour (the default); false changes memory use.
    return Problem(name, Severity.WARNING, message, value=reshard, rename="fsdp_reshard_after_forward", safe=reshard)


def repair(text: str, setting: Setting, problem: Problem) -> tuple[TextEdit, ...]:
    """The edits that repair one option in its own spelling; empty when there is no repair or it cannot be made."""
    if not problem.fixable:
        return ()
    return edit_setting(text, setting, remove=problem.remove, value=problem.value, rename=problem.rename)


# -- the Python plugin ------------------------------------------------------------------------


@dataclass(frozen=True)
class PluginProblem:
    """A plugin keyword that is wrong under FSDP2. ``replacement`` is the new argument, None to drop it;
    ``fixable`` says whether that repair applies; ``certain`` is False when the value could not be read."""

    arg: cst.Arg
    severity: Severity
    message: str
    fixable: bool
    replacement: cst.Arg | None = None
    certain: bool = True


def _bool_arg(arg: cst.Arg, name: str, value: bool) -> cst.Arg:
    return arg.with_changes(keyword=cst.Name(name), value=cst.Name(str(value)))


def judge_plugin(facts: PythonFacts, call: cst.Call) -> list[PluginProblem]:
    """The keywords of a ``FullyShardedDataParallelPlugin(...)`` call that are wrong under FSDP2."""
    keywords = {arg.keyword.value: arg for arg in call.args if arg.keyword is not None}
    problems = []
    for name, arg in keywords.items():
        node = known_value(facts, arg.value, FSDP1_OPTION_CLASSES)
        value = python_value(node)
        certain = node is not None
        if certain and value is None:
            continue  # an explicit None is the FSDP2 default
        option = f"`{name}`"
        if name in IGNORED_PLUGIN_OPTIONS:
            if name == "backward_prefetch" and _no_prefetch(value):
                continue
            message = f"{option} is ignored under FSDP2 ({IGNORED_PLUGIN_OPTIONS[name]}); remove it"
            problems.append(PluginProblem(arg, Severity.WARNING, message, True, None, certain))
        elif name == "forward_prefetch":
            message = (
                f"{option} makes accelerate raise ValueError under FSDP2, whatever its value (forward prefetch is "
                "not implemented there); remove it"
            )
            problems.append(PluginProblem(arg, Severity.ERROR, message, True, None, certain))
        elif name == "sharding_strategy":
            problems.append(_plugin_strategy(facts, call, arg, value, certain, keywords))
        elif name == "reshard_after_forward" and certain and not parses_as_bool(value):
            strategy = strategy_name(value) or enum_member(facts, value, "ShardingStrategy")
            if strategy not in RESHARD_FOR:
                continue
            reshard = RESHARD_FOR[strategy]
            message = (
                f"{option} is the FSDP1 strategy `{strategy}`; FSDP2 needs a boolean and accelerate raises "
                f"ValueError; use `reshard_after_forward={reshard}`"
            )
            problems.append(PluginProblem(arg, Severity.ERROR, message, True, _bool_arg(arg, name, reshard)))
        elif name == "state_dict_type" and certain:
            member = enum_member(facts, value, "StateDictType") or (value if isinstance(value, str) else None)
            if member is not None and is_local_state_dict(member):
                problems.append(PluginProblem(arg, Severity.ERROR, f"{option} {LOCAL_STATE_DICT}", False))
        elif name == "mixed_precision_policy" and certain:
            fsdp1_call = isinstance(value, cst.Call) and facts.callee_is(value, FSDP1_MIXED_PRECISION)
            buffer_key = isinstance(value, cst.Dict) and any(
                python_value(getattr(e, "key", None)) == "buffer_dtype" for e in value.elements
            )
            if fsdp1_call or buffer_key:
                what = "an FSDP1 `MixedPrecision`" if fsdp1_call else "a dict with the FSDP1 key `buffer_dtype`"
                message = (
                    f"{option} is {what}: accelerate raises ValueError under FSDP2; use "
                    "`MixedPrecisionPolicy(param_dtype=..., reduce_dtype=..., output_dtype=...)` or a string such as 'bf16'"
                )
                problems.append(PluginProblem(arg, Severity.ERROR, message, False))
        elif name == "cpu_offload" and isinstance(value, cst.Call) and facts.callee_is(value, FSDP1_CPU_OFFLOAD):
            offload = _offload_flag(value) if value is arg.value else None
            advice = f"pass `cpu_offload={offload}`" if offload is not None else "pass a bool or `CPUOffloadPolicy()`"
            message = f"{option} is an FSDP1 `CPUOffload`: accelerate raises ValueError under FSDP2; {advice}"
            replacement = _bool_arg(arg, name, offload) if offload is not None else None
            problems.append(PluginProblem(arg, Severity.ERROR, message, offload is not None, replacement))
    return problems


def _plugin_strategy(
    facts: PythonFacts, call: cst.Call, arg: cst.Arg, value: object, certain: bool, keywords: dict[str, cst.Arg]
) -> PluginProblem:
    reshard_arg = keywords.get("reshard_after_forward")
    if reshard_arg is None and any(a.star == "**" for a in call.args):
        # `**kwargs` may pass `reshard_after_forward` (then the keyword is merely ignored): unknown
        return PluginProblem(arg, Severity.ERROR, "", False, certain=False)
    if reshard_arg is not None and not is_name(reshard_arg.value, "None"):
        message = (
            "`sharding_strategy` is ignored under FSDP2 (accelerate logs a warning), where `reshard_after_forward` "
            "decides; remove it"
        )
        return PluginProblem(arg, Severity.WARNING, message, True, None, certain)
    strategy = (strategy_name(value) or enum_member(facts, value, "ShardingStrategy")) if certain else None
    raises = "`sharding_strategy` without `reshard_after_forward` makes accelerate raise ValueError under FSDP2; "
    if strategy not in RESHARD_FOR:
        message = f"{raises}pass `reshard_after_forward=True` or `False` instead"
        return PluginProblem(arg, Severity.ERROR, message, False, certain=certain)
    reshard = RESHARD_FOR[strategy]
    message = f"{raises}use `reshard_after_forward={reshard}` (the FSDP2 form of `{strategy}`)"
    return PluginProblem(arg, Severity.ERROR, message, True, _bool_arg(arg, "reshard_after_forward", reshard))


def _offload_flag(call: cst.Call) -> bool | None:
    """``CPUOffload()`` -> False, ``CPUOffload(offload_params=True)`` -> True; None when not a literal."""
    if not call.args:
        return False
    value = python_value(argument_of(call, "offload_params", 0))
    return value if isinstance(value, bool) and len(call.args) == 1 else None


def unreadable_option(facts: PythonFacts, arg: cst.Arg) -> bool:
    """Whether a plugin keyword whose FSDP1 value may be invalid under FSDP2 is given as something lintdist cannot
    read (so a conversion to FSDP2 cannot be known to be valid)."""
    if arg.keyword is None or arg.keyword.value not in VALUE_CHECKED_OPTIONS:
        return False
    return known_value(facts, arg.value, FSDP1_OPTION_CLASSES) is None and not is_name(arg.value, "None")


def repair_all(
    text: str, options: dict[str, object], settings: dict[str, Setting], written: Callable[[str], str], *, yaml: bool
) -> list[TextEdit] | None:
    """The edits that repair every problem FSDP2 finds in ``options``, each at its setting (``repair``); None when
    one is said by no setting of ``settings`` (another file's) or cannot be repaired cleanly."""
    edits: list[TextEdit] = []
    for problem in judge_launch_options(options, written, yaml=yaml):
        setting = settings.get(problem.name)
        edit = repair(text, setting, problem) if setting is not None else ()
        if not edit:
            return None
        edits.extend(edit)
    return edits
