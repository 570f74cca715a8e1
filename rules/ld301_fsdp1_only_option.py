"""LD301 fsdp1-only-option: an FSDP1-only option where FSDP2 is in force, in any of the four spellings.

What each place sets (plugin keyword, YAML key, flag, variable) is ``lintdist.fsdp``'s answer; the
knowledge of which option does what under FSDP2 (verified in accelerate 1.15's
``FullyShardedDataParallelPlugin.__post_init__``, ``prepare_multi_gpu_env`` and
``convert_config_to_fsdp2``) lives here as small pure functions; LD302 reuses them
for its conversion, so the two rules can never disagree about a converted file.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import libcst as cst

from lintdist.edits import with_arg_changes
from lintdist.facts import PythonFacts, argument_of
from lintdist.fsdp import (
    FSDP1_CPU_OFFLOAD,
    FSDP1_MIXED_PRECISION,
    FSDP1_OPTION_CLASSES,
    FSDP2_ACCELERATE,
    PLUGIN_CLASSES,
    config_options,
    config_version,
    fsdp_config_settings,
    fsdp_section,
    is_local_state_dict,
    launch_settings,
    plugin_version,
    strategy_name,
)
from lintdist.launch import (
    Setting,
    accelerate_runs_fsdp,
    edit_setting,
    flag_spelling,
    launcher_owns_env,
    linked_config,
    setting_span,
)
from lintdist.model import Applicability, Fix, Severity, TextEdit
from lintdist.rule import Invalid, Rule, Valid
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


# -- launch-side options (YAML keys, flags, environment variables) -----------------------------


@dataclass(frozen=True)
class Problem:
    """One launch-side option that is wrong under FSDP2, and how to repair it.

    ``remove`` deletes the option; ``value`` sets a new boolean value, under the
    name ``rename`` when given (a sharding strategy becomes ``reshard_after_forward``).
    Neither: the finding is a diagnostic only. ``safe`` is False when the repair changes
    what runs today (an ignored ``SHARD_GRAD_OP`` becoming ``reshard_after_forward: false``).
    ``certain`` is False when the value is a shell expansion (``$RESHARD``) that may be
    fine: not reported, but it keeps LD302 from converting blind.
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
    """The problems of launch-side options under FSDP2.

    ``options`` maps normalised names (``fsdp_use_orig_params``) to their values;
    ``written(name)`` gives the option as the file spells it, for messages.
    ``yaml`` says the values are YAML scalars (booleans stay booleans, ``$X`` is
    literal), which matters for the launcher's ``cpu_ram_efficient_loading`` check.
    """
    problems = []
    has_reshard = "fsdp_reshard_after_forward" in options
    for name, value in options.items():
        option = f"`{written(name)}`"
        if name in IGNORED_LAUNCH_OPTIONS:
            if name == "fsdp_backward_prefetch" and str(value).strip().upper() == "NO_PREFETCH":
                continue  # the FSDP2 behaviour already
            if name == "fsdp_sync_module_states" and yaml and value is False and _truthy_in_launcher(options):
                message = (
                    f"{option} is false while `cpu_ram_efficient_loading` is on: `accelerate launch` raises "
                    "ValueError (the check runs under FSDP2 too, where the key is otherwise ignored); remove the key"
                )
                problems.append(Problem(name, Severity.ERROR, message, remove=True))
                continue
            message = f"{option} is ignored under FSDP2 ({IGNORED_LAUNCH_OPTIONS[name]}); remove it"
            problems.append(Problem(name, Severity.WARNING, message, remove=True))
        elif name == "fsdp_sharding_strategy":
            strategy = strategy_name(value)
            if has_reshard:
                message = f"{option} is ignored under FSDP2, where `reshard_after_forward` decides; remove it"
                problems.append(Problem(name, Severity.WARNING, message, remove=True))
            elif strategy is None:
                message = f"{option} is ignored under FSDP2; set `reshard_after_forward` (true or false) instead"
                problems.append(Problem(name, Severity.WARNING, message))
            else:
                reshard = RESHARD_FOR[strategy]
                effect = "runs as a full reshard after forward" if not reshard else "has no effect"
                message = (
                    f"{option} is ignored under FSDP2 and `reshard_after_forward` defaults to true, so `{strategy}` "
                    f"{effect}; replace it with `reshard_after_forward` {str(reshard).lower()}"
                )
                # Mapping to true keeps today's behaviour (the default); false changes memory use.
                problems.append(
                    Problem(
                        name,
                        Severity.WARNING,
                        message,
                        value=reshard,
                        rename="fsdp_reshard_after_forward",
                        safe=reshard,
                    )
                )
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
            message = (
                f"{option} is LOCAL_STATE_DICT, which FSDP2 does not support: accelerate raises ValueError; "
                "use SHARDED_STATE_DICT or FULL_STATE_DICT"
            )
            problems.append(Problem(name, Severity.ERROR, message))
    return problems


def _truthy_in_launcher(options: dict[str, object]) -> bool:
    """``cpu_ram_efficient_loading`` as the launcher tests it: absent means the default string "true"."""
    return bool(options.get("fsdp_cpu_ram_efficient_loading", "true"))


def repair(text: str, setting: Setting, problem: Problem) -> tuple[TextEdit, ...]:
    """The edits that repair one option in its own spelling; empty when there is no repair or it cannot be made."""
    if not problem.fixable:
        return ()
    return edit_setting(text, setting, remove=problem.remove, value=problem.value, rename=problem.rename)


# -- the Python plugin ------------------------------------------------------------------------


@dataclass(frozen=True)
class PluginProblem:
    """A plugin keyword that is wrong under FSDP2. ``replacement`` is the new argument, None to drop it;
    ``fixable`` says whether that repair applies."""

    arg: cst.Arg
    severity: Severity
    message: str
    fixable: bool
    replacement: cst.Arg | None = None
    certain: bool = True  # False: the value could not be read (a parameter, `args.x`...)


def bool_arg(arg: cst.Arg, name: str, value: bool) -> cst.Arg:
    return arg.with_changes(keyword=cst.Name(name), value=cst.Name(str(value)))


def judge_plugin(facts: PythonFacts, call: cst.Call) -> list[PluginProblem]:
    """The keywords of a ``FullyShardedDataParallelPlugin(...)`` call that are wrong under FSDP2."""
    keywords = {arg.keyword.value: arg for arg in call.args if arg.keyword is not None}
    values = {name: known_value(facts, arg.value, FSDP1_OPTION_CLASSES) for name, arg in keywords.items()}
    problems = []
    for name, arg in keywords.items():
        node = values[name]
        value = python_value(node)
        certain = node is not None
        if certain and value is None:
            continue  # an explicit None is the FSDP2 default
        option = f"`{name}`"
        if name in {"use_orig_params", "sync_module_states", "limit_all_gathers", "param_init_fn"}:
            why = {
                "use_orig_params": "accelerate logs a warning and drops it: FSDP2 always trains the original parameters",
                "sync_module_states": "accelerate logs a warning and drops it: FSDP2 has no module-state sync",
                "limit_all_gathers": "`fully_shard` has no such option and accelerate never passes it",
                "param_init_fn": "accelerate's FSDP2 path never calls it",
            }[name]
            problems.append(
                PluginProblem(
                    arg, Severity.WARNING, f"{option} is ignored under FSDP2 ({why}); remove it", True, None, certain
                )
            )
        elif name == "backward_prefetch":
            if isinstance(value, str) and value.upper() == "NO_PREFETCH":
                continue
            message = f"{option} is ignored under FSDP2 (accelerate logs a warning and resets it to None); remove it"
            problems.append(PluginProblem(arg, Severity.WARNING, message, True, None, certain))
        elif name == "forward_prefetch":
            message = (
                f"{option} makes accelerate raise ValueError under FSDP2, whatever its value (forward prefetch is "
                "not implemented there); remove it"
            )
            problems.append(PluginProblem(arg, Severity.ERROR, message, True, None, certain))
        elif name == "sharding_strategy":
            problems.append(_sharding_problem(facts, call, arg, value, certain, keywords))
        elif name == "reshard_after_forward" and certain and not parses_as_bool(value):
            strategy = strategy_name(value) or enum_member(facts, value, "ShardingStrategy")
            if strategy not in RESHARD_FOR:
                continue
            reshard = RESHARD_FOR[strategy]
            message = (
                f"{option} is the FSDP1 strategy `{strategy}`; FSDP2 needs a boolean and accelerate raises "
                f"ValueError; use `reshard_after_forward={reshard}`"
            )
            problems.append(PluginProblem(arg, Severity.ERROR, message, True, bool_arg(arg, name, reshard)))
        elif name == "state_dict_type" and certain:
            member = enum_member(facts, value, "StateDictType") or (value if isinstance(value, str) else None)
            if member is not None and is_local_state_dict(member):
                message = (
                    f"{option} is LOCAL_STATE_DICT, which FSDP2 does not support: accelerate raises ValueError; "
                    "use SHARDED_STATE_DICT or FULL_STATE_DICT"
                )
                problems.append(PluginProblem(arg, Severity.ERROR, message, False))
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
            replacement = bool_arg(arg, name, offload) if offload is not None else None
            problems.append(PluginProblem(arg, Severity.ERROR, message, offload is not None, replacement))
    return problems


def _sharding_problem(
    facts: PythonFacts, call: cst.Call, arg: cst.Arg, value: object, certain: bool, keywords: dict[str, cst.Arg]
) -> PluginProblem:
    reshard_arg = keywords.get("reshard_after_forward")
    if reshard_arg is None and any(a.star == "**" for a in call.args):
        # `**kwargs` may pass `reshard_after_forward` (then the keyword is merely ignored): unknown
        return PluginProblem(arg, Severity.ERROR, "", False, certain=False)
    if reshard_arg is not None and not _is_none(reshard_arg.value):
        message = (
            "`sharding_strategy` is ignored under FSDP2 (accelerate logs a warning), where `reshard_after_forward` "
            "decides; remove it"
        )
        return PluginProblem(arg, Severity.WARNING, message, True, None, certain)
    strategy = strategy_name(value) if certain else None
    strategy = strategy or (enum_member(facts, value, "ShardingStrategy") if certain else None)
    if strategy not in RESHARD_FOR:
        message = (
            "`sharding_strategy` without `reshard_after_forward` makes accelerate raise ValueError under FSDP2; "
            "pass `reshard_after_forward=True` or `False` instead"
        )
        return PluginProblem(arg, Severity.ERROR, message, False, certain=certain)
    reshard = RESHARD_FOR[strategy]
    message = (
        "`sharding_strategy` without `reshard_after_forward` makes accelerate raise ValueError under FSDP2; "
        f"use `reshard_after_forward={reshard}` (the FSDP2 form of `{strategy}`)"
    )
    return PluginProblem(arg, Severity.ERROR, message, True, bool_arg(arg, "reshard_after_forward", reshard))


def _is_none(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Name) and expr.value == "None"


def _offload_flag(call: cst.Call) -> bool | None:
    """``CPUOffload()`` -> False, ``CPUOffload(offload_params=True)`` -> True; None when not a literal."""
    if not call.args:
        return False
    value = python_value(argument_of(call, "offload_params", 0))
    return value if isinstance(value, bool) and len(call.args) == 1 else None


# -- the rule ---------------------------------------------------------------------------------------


class Fsdp1OnlyOption(Rule):
    """
    ## What it does
    Reports FSDP1-only options where FSDP2 is in force, in each of their four
    spellings: a `FullyShardedDataParallelPlugin(...)` keyword, an
    `fsdp_config` key of an accelerate config, an `accelerate launch` flag
    (`--fsdp_use_orig_params` or `--fsdp-use-orig-params`) and an `FSDP_*`
    environment variable in a launch file. The report points at the keyword,
    key, flag or variable itself. FSDP2 is in force when the same place says
    `fsdp_version: 2` (`--fsdp_version 2`, `FSDP_VERSION=2`), or, for a plugin
    built in code without `fsdp_version`, when the launch that runs the script
    says so. No version anywhere means FSDP1, and nothing is reported.

    ## Why is this bad?
    FSDP2 (`fully_shard`) dropped most FSDP1 knobs, and accelerate handles the
    leftovers inconsistently. Some raise `ValueError` when the plugin is
    built: `forward_prefetch` (any value), `sharding_strategy` without
    `reshard_after_forward`, a sharding strategy given as
    `reshard_after_forward`, `LOCAL_STATE_DICT`, an FSDP1 `MixedPrecision` or
    `CPUOffload`, and `accelerate launch` with `cpu_ram_efficient_loading: true`
    and `sync_module_states: false`. The others are silently ignored:
    `use_orig_params`, `sync_module_states`, `backward_prefetch`,
    `limit_all_gathers`, `param_init_fn`, and on the launch side
    `forward_prefetch` and `sharding_strategy`, so `SHARD_GRAD_OP` quietly
    becomes a full reshard. Errors are reported as errors, ignored options as
    warnings.

    ## Example
    ```yaml
    distributed_type: FSDP
    fsdp_config:
      fsdp_version: 2
      fsdp_sharding_strategy: SHARD_GRAD_OP
      fsdp_use_orig_params: true
    ```

    ## Use instead
    ```yaml
    distributed_type: FSDP
    fsdp_config:
      fsdp_version: 2
      fsdp_reshard_after_forward: false
    ```

    ## Fix safety
    Safe: the fix removes options FSDP2 ignores or rejects, and writes the
    FSDP2 form of a sharding strategy (`FULL_SHARD` and `HYBRID_SHARD` become
    `reshard_after_forward: true`, `SHARD_GRAD_OP`, `HYBRID_SHARD_ZERO2` and
    `NO_SHARD` become `false`, as `accelerate to-fsdp2` maps them) and of
    `CPUOffload(offload_params=...)`. One repair is unsafe (`--unsafe-fixes`):
    in a config, flag or variable, an ignored `SHARD_GRAD_OP`-like strategy
    becoming `reshard_after_forward: false`, because the job runs fully
    resharded today and keeping parameters gathered after forward needs more
    memory. (In a plugin the same keyword raises, so there the fix is safe.)
    YAML edits touch only the reported line, keeping comments and order; a
    removed flag takes its `\\` continuation line with it. `LOCAL_STATE_DICT`,
    an FSDP1 `MixedPrecision` and values lintdist cannot read are reported
    without a fix, and so are keys of a flow mapping (`fsdp_config: {...}`).
    Keywords whose value is `None`, or cannot be read, flags and variables
    whose value the shell fills in (`$RESHARD`), and keys merged in from a YAML
    anchor (`<<: *base`) are not reported.

    ## References
    - accelerate `FullyShardedDataParallelPlugin.__post_init__` (`accelerate/utils/dataclasses.py`)
    - accelerate `prepare_multi_gpu_env` (`accelerate/utils/launch.py`) and `convert_config_to_fsdp2`
      (`accelerate/commands/to_fsdp2.py`)
    - [accelerate: FSDP1 vs FSDP2](https://huggingface.co/docs/accelerate/concept_guides/fsdp1_vs_fsdp2)
    """

    code = "LD301"
    name = "fsdp1-only-option"
    severity = Severity.WARNING
    fix_kind = "safe"
    kinds = frozenset({"python", "config", "launch"})
    triggers = ("FullyShardedDataParallelPlugin", "fsdp", "FSDP_")
    python_triggers = ("FullyShardedDataParallelPlugin",)  # in Python, only the plugin's keywords are read

    VALID = (
        Valid(
            """\
from accelerate import Accelerator, FullyShardedDataParallelPlugin

plugin = FullyShardedDataParallelPlugin(use_orig_params=True, sharding_strategy="SHARD_GRAD_OP")
accelerator = Accelerator(fsdp_plugin=plugin)
"""
        ),
        Valid(
            """\
from accelerate import Accelerator
from accelerate.utils import FullyShardedDataParallelPlugin

plugin = FullyShardedDataParallelPlugin(
    fsdp_version=2, reshard_after_forward=False, use_orig_params=None, forward_prefetch=None
)
accelerator = Accelerator(fsdp_plugin=plugin)
"""
        ),
        Valid(
            """\
distributed_type: FSDP
fsdp_config:
  fsdp_version: 1
  fsdp_use_orig_params: true
  fsdp_sharding_strategy: SHARD_GRAD_OP
""",
            filename="config.yaml",
        ),
        Valid(
            """\
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
  fsdp_reshard_after_forward: true
  fsdp_backward_prefetch: NO_PREFETCH
  fsdp_state_dict_type: SHARDED_STATE_DICT
""",
            filename="config.yaml",
        ),
        Valid(
            "accelerate launch --use_fsdp --fsdp_use_orig_params true --num_processes 2 train.py\n",
            filename="launch.sh",
        ),
    )
    INVALID = (
        Invalid(
            """\
from accelerate import Accelerator
from accelerate.utils import FullyShardedDataParallelPlugin as FSDPPlugin

plugin = FSDPPlugin(fsdp_version=2, use_orig_params=True, sharding_strategy="SHARD_GRAD_OP")
accelerator = Accelerator(fsdp_plugin=plugin)
""",
            lines=(4, 4),
            fixed="""\
from accelerate import Accelerator
from accelerate.utils import FullyShardedDataParallelPlugin as FSDPPlugin

plugin = FSDPPlugin(fsdp_version=2, reshard_after_forward=False)
accelerator = Accelerator(fsdp_plugin=plugin)
""",
        ),
        Invalid(
            """\
import accelerate
from torch.distributed.fsdp import ShardingStrategy

plugin = accelerate.FullyShardedDataParallelPlugin(
    fsdp_version=2,
    reshard_after_forward=ShardingStrategy.FULL_SHARD,
    forward_prefetch=False,
)
""",
            lines=(6, 7),
            fixed="""\
import accelerate
from torch.distributed.fsdp import ShardingStrategy

plugin = accelerate.FullyShardedDataParallelPlugin(
    fsdp_version=2,
    reshard_after_forward=True,
)
""",
        ),
        Invalid(
            """\
# FSDP2 run
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2  # new API
  fsdp_sharding_strategy: SHARD_GRAD_OP  # from the FSDP1 config
  fsdp_use_orig_params: true
  fsdp_offload_params: false
""",
            lines=(5, 6),
            fixed="""\
# FSDP2 run
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2  # new API
  fsdp_sharding_strategy: SHARD_GRAD_OP  # from the FSDP1 config
  fsdp_offload_params: false
""",
            unsafe_fixed="""\
# FSDP2 run
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2  # new API
  fsdp_reshard_after_forward: false  # from the FSDP1 config
  fsdp_offload_params: false
""",
            filename="config.yaml",
        ),
        Invalid(
            """\
accelerate launch \\
  --use_fsdp --fsdp-version 2 \\
  --fsdp-use-orig-params true \\
  --fsdp_reshard_after_forward FULL_SHARD \\
  --num_processes 2 train.py --lr 1e-4
""",
            lines=(3, 4),
            fixed="""\
accelerate launch \\
  --use_fsdp --fsdp-version 2 \\
  --fsdp_reshard_after_forward true \\
  --num_processes 2 train.py --lr 1e-4
""",
            filename="launch.sh",
        ),
        Invalid(
            """\
export FSDP_VERSION=2
export FSDP_USE_ORIG_PARAMS=true
torchrun --nproc_per_node 2 train.py
""",
            lines=(2,),
            fixed="""\
export FSDP_VERSION=2
torchrun --nproc_per_node 2 train.py
""",
            filename="launch.sh",
        ),
    )

    def finish(self) -> None:
        if self.versions.allows("accelerate", FSDP2_ACCELERATE) is not False:  # else `fsdp_version` means nothing
            super().finish()

    # -- Python -----------------------------------------------------------------------------------

    def check_python(self) -> None:
        facts = self.facts
        for call in facts.calls:
            if not facts.callee_is(call, PLUGIN_CLASSES):
                continue
            version, setting = plugin_version(facts, call, self.context.settings, self.context.text)
            if version != 2:
                continue
            origin = "" if setting is None else f" (FSDP2 comes from {_where(setting)})"
            for problem in judge_plugin(facts, call):
                if not problem.certain:
                    continue
                fix = None
                if problem.fixable:
                    new_call = with_arg_changes(call, {id(problem.arg): problem.replacement})
                    verb = "Remove" if problem.replacement is None else "Replace"
                    fix = Fix(
                        Applicability.SAFE, f"{verb} `{problem.arg.keyword.value}`", replacements=((call, new_call),)
                    )
                self.report(problem.arg, problem.message + origin, fix=fix, severity=problem.severity)

    # -- accelerate config ------------------------------------------------------------------------

    def check_config(self, document) -> None:
        section = fsdp_section(document)
        if section is None or str(config_version(section)).strip() != "2":
            return
        settings = fsdp_config_settings(document, self.context.display_name)
        self._report_settings(settings, {name: s.raw for name, s in settings.items()}.get, yaml=True)

    # -- launch files -----------------------------------------------------------------------------

    def check_launch(self, launch) -> None:
        reported: set[int] = set()
        for command in launch.commands or [None]:
            document, config_name = (None, "") if command is None else linked_config(command, self.context.path)
            settings = launch_settings(self.context.text, launch, command, self.context.display_name)
            # FSDP flags do nothing on a line that runs another backend
            accelerate = command is not None and command.launcher == "accelerate"
            if accelerate and accelerate_runs_fsdp(command, document) is not False:
                flags = {s.name: s for s in settings if s.spelling == "flag" and s.name.startswith("fsdp_")}
                self._check_flags(flags, config_options(document), config_name, reported)
            if not launcher_owns_env(command, document):
                env = {s.name: s for s in settings if s.spelling == "env" and s.raw.startswith("FSDP_")}
                if str(env.get("fsdp_version", Setting("", None, "", 0, 0, "")).value).strip() == "2":
                    self._report_settings(env, str.upper, yaml=False, reported=reported)

    def _check_flags(self, flags: dict[str, Setting], config: dict, config_name: str, reported: set[int]) -> None:
        version = flags["fsdp_version"].value if "fsdp_version" in flags else config.get("fsdp_version")
        if str(version).strip() != "2":
            return
        origin = "" if "fsdp_version" in flags else f" (FSDP2 comes from {config_name})"
        # the config's keys join the judgement (a flag may conflict with one) but are reported in the config
        options = {**config, **{name: flag.value for name, flag in flags.items()}}
        spelled = {name: flag_spelling(flag.token, name) for name, flag in flags.items()}
        self._report_settings(
            flags, lambda n: spelled.get(n, n), yaml=False, reported=reported, origin=origin, options=options
        )

    def _report_settings(
        self,
        settings: dict[str, Setting],
        written,
        *,
        yaml: bool,
        reported: set[int] | None = None,
        origin: str = "",
        options: dict[str, object] | None = None,
    ) -> None:
        """Judge the options these settings say and report each problem at its setting, with its repair."""
        options = options if options is not None else {name: s.value for name, s in settings.items()}
        text = self.context.text
        for problem in judge_launch_options(options, written, yaml=yaml):
            setting = settings.get(problem.name)
            if setting is None or not problem.certain:
                continue
            if reported is not None:
                if setting.token.start in reported:
                    continue
                reported.add(setting.token.start)
            self.report(
                None,
                problem.message + origin,
                fix=_text_fix(problem, repair(text, setting, problem)),
                severity=problem.severity,
                span=setting_span(text, setting),
            )


def _text_fix(problem: Problem, edits: tuple[TextEdit, ...]) -> Fix | None:
    if not edits:
        return None
    if problem.remove:
        message = "Remove the option"
    elif problem.rename:
        message = f"Replace it with `reshard_after_forward` {str(problem.value).lower()}"
    else:
        message = f"Set it to {str(problem.value).lower()}"
    return Fix(Applicability.SAFE if problem.safe else Applicability.UNSAFE, message, edits=edits)


def _where(setting: Setting) -> str:
    return f"{os.path.basename(setting.path)}:{setting.line}"
