"""LD301 fsdp1-only-option: an FSDP1-only option where FSDP2 is in force, in any of the four spellings.

What each place sets (plugin keyword, YAML key, flag, variable) is ``lintdist.fsdp``'s answer, and what FSDP2
makes of each option is ``lintdist.fsdp2_options``'s; LD302 converts with the same repairs.
"""

from __future__ import annotations

from lintdist.edits import with_arg_changes
from lintdist.fsdp import (
    FSDP2_ACCELERATE,
    PLUGIN_CLASSES,
    config_version,
    fsdp_config_settings,
    fsdp_section,
    launch_line_options,
    launch_settings,
    plugin_version,
)
from lintdist.fsdp2_options import Problem, judge_launch_options, judge_plugin, repair
from lintdist.launch import (
    Setting,
    accelerate_runs_fsdp,
    flag_spelling,
    launcher_owns_env,
    linked_config,
    setting_place,
    setting_span,
)
from lintdist.model import Applicability, Fix, Severity, TextEdit
from lintdist.rule import Invalid, Rule, Valid

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
            origin = "" if setting is None else f" (FSDP2 comes from {setting_place(setting)})"
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
                self._check_flags(flags, launch_line_options(command, document), config_name, reported)
            if not launcher_owns_env(command, document):
                env = {s.name: s for s in settings if s.spelling == "env" and s.raw.startswith("FSDP_")}
                if "fsdp_version" in env and str(env["fsdp_version"].value).strip() == "2":
                    self._report_settings(env, str.upper, yaml=False, reported=reported)

    def _check_flags(self, flags: dict[str, Setting], options: dict, config_name: str, reported: set[int]) -> None:
        # the config's keys join the judgement (a flag may conflict with one) but are reported in the config
        if str(options.get("fsdp_version")).strip() != "2":
            return
        origin = "" if "fsdp_version" in flags else f" (FSDP2 comes from {config_name})"
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
