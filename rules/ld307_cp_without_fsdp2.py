"""LD307 cp-without-fsdp2: context parallelism (`cp_size > 1`) where accelerate has no FSDP2 plugin.

Verified in accelerate 1.15 (`accelerate/state.py`, `AcceleratorState.__init__`): in the branch for the
multi-device types (`MULTI_GPU`, `MULTI_NPU`, `MULTI_XPU`, ...), unless `ACCELERATE_ALLOW_CP_STANDALONE=true`,
`cp_enabled` with `fsdp_plugin is None` raises ValueError ("... no `fsdp_plugin` was provided"), and with
`fsdp_plugin.fsdp_version == 1` raises ValueError ("Using `cp_size>1` requires FSDP2"). The plugin is the
`Accelerator`'s `fsdp_plugin=`, else the one it builds from `ACCELERATE_USE_FSDP` (and `FSDP_VERSION`, default 1).
The escape hatch only moves the crash: with it, `AcceleratorState` switches to FSDP anyway and
`ParallelismConfig._validate_accelerator` fails (AttributeError without a plugin, ValueError with FSDP1); run on
2 gloo ranks in tests/proofs/test_ld307_fix.py.
"""

from __future__ import annotations

import libcst as cst

from lintdist.facts import ACCELERATOR_CLASSES, argument_of
from lintdist.fsdp import given_plugins, launched_fsdp
from lintdist.launch import (
    LaunchSettings,
    Setting,
    command_settings,
    config_settings,
    linked_config,
    number,
    parallelism_exported,
    setting_place,
    setting_span,
    switched_on,
    written,
)
from lintdist.literals import is_name
from lintdist.model import Severity
from lintdist.parallelism import PARALLELISM_CONFIGS, SIZE_POSITIONS
from lintdist.receivers import receiving_calls
from lintdist.rule import Invalid, Rule, Valid
from lintdist.values import known_value, python_value

CP_POSITION = SIZE_POSITIONS["cp"]
CP_SETTING = "parallelism_config_cp_size"
STANDALONE = "ACCELERATE_ALLOW_CP_STANDALONE"
HATCH = (
    f"; `{STANDALONE}` skips that check, but `Accelerator()` then fails in "
    "`ParallelismConfig._validate_accelerator` all the same"
)
# The distributed types whose branch of `AcceleratorState.__init__` holds the check (FSDP is chosen there too).
MULTI_DEVICE = frozenset(
    {"MULTI_GPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA", "MULTI_XPU", "MULTI_HPU", "MULTI_NEURON"}
)
RAISES_NONE = (
    "`AcceleratorState` raises ValueError ('`cp_size > 1` specified in the `parallelism_config`, but no "
    "`fsdp_plugin` was provided')"
)
RAISES_FSDP1 = "`AcceleratorState` raises ValueError ('Using `cp_size>1` requires FSDP2, but the provided `fsdp_plugin` is using FSDP1')"
ADVICE = "context parallelism needs FSDP2"


class CpWithoutFsdp2(Rule):
    """
    ## What it does
    Reports context parallelism switched on (`cp_size` above 1) for a
    multi-GPU accelerate run that has no FSDP2 plugin: no FSDP at all, or
    FSDP version 1. It reads each spelling: `ParallelismConfig(cp_size=k)` in
    code (reported at `cp_size`) given to an `Accelerator`, the
    `parallelism_config: {parallelism_config_cp_size: k}` section of an
    accelerate config (reported at the key), and `accelerate launch
    --use_parallelism_config --parallelism_config_cp_size k` (reported at the
    flag). The FSDP plugin is the `Accelerator`'s `fsdp_plugin=`, else the one
    the launch asks for (`distributed_type: FSDP`, `--use_fsdp`,
    `ACCELERATE_USE_FSDP=true`) with its `fsdp_version` (default 1).

    ## Why is this bad?
    accelerate implements context parallelism on top of FSDP2 (the model is
    sharded over the joint `dp_shard_cp` mesh). When the run starts on several
    GPUs, `AcceleratorState` checks this before anything else and raises
    `ValueError`: "`cp_size > 1` specified in the `parallelism_config`, but no
    `fsdp_plugin` was provided", or "Using `cp_size>1` requires FSDP2, but the
    provided `fsdp_plugin` is using FSDP1". `accelerate launch` itself rejects
    `--use_parallelism_config` without `--use_fsdp` on the command line (it
    checks before it reads the config file), and that is reported too.
    `ACCELERATE_ALLOW_CP_STANDALONE=true` skips the check but does not help:
    `AcceleratorState` then switches to FSDP without an FSDP2 plugin and
    `Accelerator()` fails a few lines later, in
    `ParallelismConfig._validate_accelerator` (`AttributeError` without a
    plugin, `ValueError` with an FSDP1 one).

    Not reported: a launch on the CPU (`--cpu`, `use_cpu: true`,
    `Accelerator(cpu=True)`) or on one process (`num_processes: 1`), a DeepSpeed
    or TPU backend (that check is not on their path), a `cp_size` or FSDP
    version lintdist cannot read, a `ParallelismConfig` that no `Accelerator`
    of the file receives (the HF `Trainer` builds its own), and a script with
    no FSDP plugin whose launch is not in sight (an FSDP2 config may supply
    it). When
    the device count is unknown the report says so: on the CPU accelerate
    rejects `cp_size > 1` with another `ValueError` (the CPU has no FSDP in
    accelerate), and on one process the mesh cannot be built.

    ## Example
    ```python
    from accelerate import Accelerator, FullyShardedDataParallelPlugin, ParallelismConfig

    accelerator = Accelerator(
        parallelism_config=ParallelismConfig(cp_size=4),
        fsdp_plugin=FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap"),
    )
    ```

    ## Use instead
    ```python
    from accelerate import Accelerator, FullyShardedDataParallelPlugin, ParallelismConfig

    accelerator = Accelerator(
        parallelism_config=ParallelismConfig(cp_size=4),
        fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap"),
    )
    ```
    Or launch with an FSDP2 config (`distributed_type: FSDP` and
    `fsdp_config: {fsdp_version: 2}`), or
    `accelerate launch --use_fsdp --fsdp_version 2 --use_parallelism_config --parallelism_config_cp_size 4`.

    ## Fix safety
    No fix: switching to FSDP2 changes the plugin's options (several FSDP1
    options are rejected or ignored under FSDP2, see LD301), and dropping
    context parallelism changes the memory each GPU needs.

    ## References
    - accelerate `accelerate/state.py`, `AcceleratorState.__init__` (the `cp_enabled` checks and
      `ACCELERATE_ALLOW_CP_STANDALONE`)
    - accelerate `accelerate/accelerator.py`, `Accelerator.__init__` (the plugin built from `ACCELERATE_USE_FSDP`,
      the `ParallelismConfig` built from `ACCELERATE_USE_PARALLELISM_CONFIG`)
    - accelerate `accelerate/commands/launch.py`, `_validate_launch_command`, and `accelerate/utils/launch.py`,
      `prepare_extend_env_parallelism_config`
    - [accelerate: context parallelism](https://huggingface.co/docs/accelerate/concept_guides/context_parallelism)
    """

    code = "LD307"
    name = "cp-without-fsdp2"
    severity = Severity.ERROR
    fix_kind = "none"
    kinds = frozenset({"python", "config", "launch"})
    triggers = ("cp_size",)
    python_triggers = ("ParallelismConfig",)

    VALID = (
        Valid(
            """\
from accelerate import Accelerator, FullyShardedDataParallelPlugin, ParallelismConfig

plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
accelerator = Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=2, cp_size=2), fsdp_plugin=plugin)
"""
        ),
        Valid(
            """\
from accelerate import Accelerator, FullyShardedDataParallelPlugin
from accelerate.parallelism_config import ParallelismConfig

accelerator = Accelerator(
    parallelism_config=ParallelismConfig(cp_size=1),
    fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=1),
)
"""
        ),
        Valid(
            """\
from accelerate import Accelerator, ParallelismConfig

accelerator = Accelerator(parallelism_config=ParallelismConfig(cp_size=4))
""",
            project={
                "config.yaml": "distributed_type: FSDP\nnum_processes: 4\nfsdp_config:\n  fsdp_version: 2\n",
            },
        ),
        Valid(
            """\
distributed_type: FSDP
num_processes: 8
fsdp_config:
  fsdp_version: 2
parallelism_config:
  parallelism_config_cp_size: 8
""",
            filename="config.yaml",
        ),
        Valid(
            "accelerate launch --cpu --num_processes 2 --use_parallelism_config --parallelism_config_cp_size 2 t.py\n",
            filename="launch.sh",
        ),
    )
    INVALID = (
        Invalid(
            """\
from accelerate import Accelerator, FullyShardedDataParallelPlugin, ParallelismConfig

plugin = FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap")
accelerator = Accelerator(parallelism_config=ParallelismConfig(cp_size=4), fsdp_plugin=plugin)
""",
            lines=(4,),
        ),
        Invalid(
            """\
from accelerate import Accelerator
from accelerate.utils import ParallelismConfig

accelerator = Accelerator(parallelism_config=ParallelismConfig(1, 1, 1, 2))
""",
            lines=(4,),
            project={"config.yaml": "distributed_type: MULTI_GPU\nnum_processes: 2\n"},
        ),
        Invalid(
            """\
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
num_processes: 4
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
parallelism_config:
  parallelism_config_cp_size: 4
""",
            lines=(7,),
            filename="config.yaml",
        ),
        Invalid(
            """\
accelerate launch --use_fsdp --fsdp_version 1 --num_processes 2 \\
  --use_parallelism_config --parallelism_config_cp_size 2 train.py
""",
            lines=(2,),
            filename="launch.sh",
        ),
    )

    # -- Python ---------------------------------------------------------------------------------

    def check_python(self) -> None:
        facts = self.facts
        settings = self.context.settings  # the launch's own: code keywords are read from the code here
        for call in facts.calls:
            if not facts.callee_is(call, PARALLELISM_CONFIGS):
                continue
            value = argument_of(call, "cp_size", CP_POSITION)
            cp = python_value(known_value(facts, value)) if value is not None else None
            if not isinstance(cp, int) or isinstance(cp, bool) or cp <= 1:
                continue
            arg = next(a for a in call.args if a.value is value)
            for accelerator, _ in receiving_calls(facts, call, ACCELERATOR_CLASSES, "parallelism_config"):
                problem = self._accelerator_problem(accelerator, settings)
                if problem is not None:
                    hatch = HATCH if STANDALONE in self.context.text else ""
                    self.report(arg, f"`cp_size={cp}` turns on context parallelism, but {problem}{hatch}")
                    break

    def _accelerator_problem(self, accelerator: cst.Call, settings: LaunchSettings | None) -> str | None:
        facts = self.facts
        if any(a.star for a in accelerator.args):
            return None  # `**kwargs` may carry the plugin or `cpu=True`
        cpu = argument_of(accelerator, "cpu", None)
        if cpu is not None and python_value(known_value(facts, cpu)) is not False:
            return None  # on the CPU (or maybe): not the multi-device path
        devices = _device_count(settings)
        if devices is False:
            return None
        line = self.context.span(accelerator).line
        plugin = argument_of(accelerator, "fsdp_plugin", None)
        if plugin is not None and not is_name(plugin, "None"):
            plugins = given_plugins(facts, accelerator, settings, self.context.text)
            if not plugins or None in plugins:
                return None  # maybe None on some path, or a plugin made where lintdist cannot see
            if any(version != 1 for _, version, _ in plugins):
                return None
            where = next((s for _, _, s in plugins if s is not None), None)
            source = f"from {_where(where)}" if where else "`fsdp_version` is not given and accelerate's default is 1"
            what = f"the FSDP plugin given to the `Accelerator` at line {line} is FSDP1 ({source})"
            return f"{what}: on a multi-GPU launch {RAISES_FSDP1}; {ADVICE}: pass `fsdp_version=2`{_unknown(devices)}"
        if settings is None:
            return None  # no plugin in code and no launch in sight: an FSDP2 config may supply it
        launched = _launch_fsdp(settings)
        if launched is None or launched[0] == 2:
            return None
        version, where = launched
        if version == 1:
            what = f"the launch runs FSDP1 ({where}) and the `Accelerator` at line {line} gets no `fsdp_plugin`"
            return f"{what}: on a multi-GPU launch {RAISES_FSDP1}; {ADVICE}: launch with `fsdp_version: 2`{_unknown(devices)}"
        what = f"neither the `Accelerator` at line {line} nor its launch ({where}) provides an FSDP plugin"
        return (
            f"{what}: on a multi-GPU launch {RAISES_NONE}; {ADVICE}: pass "
            f"`fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2, ...)` or launch with an FSDP2 config"
            f"{_unknown(devices)}"
        )

    # -- accelerate config ----------------------------------------------------------------------

    def check_config(self, document) -> None:
        if document.flavour != "accelerate":
            return
        settings = LaunchSettings({s.name: s for s in config_settings(document, self.context.display_name)})
        cp = settings.get(CP_SETTING)
        if cp is None or cp.keys[:1] != ("parallelism_config",) or not _above_one(cp):
            return
        problem = _launch_problem(settings, command_line=())
        if problem is not None:
            self.report(None, problem, span=setting_span(self.context.text, cp))

    # -- launch files ---------------------------------------------------------------------------

    def check_launch(self, launch) -> None:
        for command in launch.commands:
            if command.launcher != "accelerate":
                continue
            document, config_name = linked_config(command, self.context.path)
            line_settings = command_settings(command, launch, self.context.text, self.context.display_name)
            said = [*(config_settings(document, config_name) if document is not None else ()), *line_settings]
            settings = LaunchSettings({s.name: s for s in said})
            cp = settings.get(CP_SETTING)
            if cp is None or cp.spelling != "flag" or not _above_one(cp):
                continue  # a config's value is reported in the config
            flags = tuple(s.name for s in line_settings if s.spelling == "flag")
            problem = _launch_problem(settings, command_line=flags)
            if problem is not None and "raises ValueError ('You cannot" not in problem:
                # an `export` counts for the commands after it
                exported = [e for e in launch.exports if cp.token is None or e[2].start < cp.token.start]
                hatch = any(name == STANDALONE for name, _, _ in [*exported, *command.env])
                problem += HATCH if hatch else ""
            if problem is not None:
                self.report(None, problem, span=setting_span(self.context.text, cp))


# -- what the launch says ---------------------------------------------------------------------------


def _above_one(setting: Setting) -> bool:
    value = number(setting)
    return value is not None and value > 1


def _device_count(settings: LaunchSettings | None) -> bool | None:
    """True: a multi-device launch; False: the CPU or one process; None: unknown."""
    if settings is None:
        return None
    if switched_on(settings.get("cpu")) or switched_on(settings.get("use_cpu")):
        return False
    backend = settings.distributed_type
    if backend is not None and str(backend.value).upper() in {"NO", "MULTI_CPU"}:
        return False
    counts = [number(settings.get(name)) for name in ("num_processes", "nproc_per_node")]
    nodes = number(settings.get("num_machines")) or number(settings.get("nnodes")) or 1
    count = next((c for c in counts if c is not None), None)
    return None if count is None else count * nodes > 1


def _launch_fsdp(settings: LaunchSettings) -> tuple[int | None, str] | None:
    """The FSDP plugin the ``Accelerator`` builds from the launch: (2 or 1, where it is said), (None, where the
    backend is said) when it builds none; None where the backend is not the multi-device path or unknown."""
    launched = launched_fsdp(settings)
    if launched is not None:
        version, setting = launched
        if setting.name != "fsdp_version":  # no version said: the backend setting
            return 1, f"{_where(setting)} without `fsdp_version`: accelerate's default is 1"
        return (version, _where(setting)) if version is not None else None
    backend = settings.distributed_type
    name = str(backend.value).upper() if backend is not None else None
    if name in MULTI_DEVICE:
        return None, _where(backend)
    count = settings.get("num_processes") or settings.get("nproc_per_node")
    if name is None and count is not None:
        return None, _where(count)  # torchrun / accelerate without a backend: plain DDP
    return None


def _launch_problem(settings: LaunchSettings, command_line: tuple[str, ...]) -> str | None:
    """What goes wrong when an accelerate config or launch line turns context parallelism on; None if nothing.

    ``command_line`` names the flags of the launch line (empty for a config on its own)."""
    cp_setting = settings.get(CP_SETTING)
    cp = written(cp_setting, where=False)
    requested = switched_on(settings.get("use_parallelism_config"))
    if not parallelism_exported(settings):
        return None  # the launcher exports no `PARALLELISM_CONFIG_*`: context parallelism is not on
    devices = _device_count(settings)
    if devices is False:
        return None
    if (
        "use_parallelism_config" in command_line
        and requested
        and not ("use_fsdp" in command_line and switched_on(settings.get("use_fsdp")))
    ):
        return (
            f"{cp} with `--use_parallelism_config` but no `--use_fsdp` on the command "
            "line: `accelerate launch` raises ValueError ('You cannot use `--use_parallelism_config` without "
            "`--use_fsdp` and `--fsdp_version=2`') before it reads any config file; add `--use_fsdp --fsdp_version 2`"
        )
    launched = _launch_fsdp(settings)
    if launched is None or launched[0] == 2:
        return None
    version, where = launched
    if version == 1:
        return (
            f"{cp} turns on context parallelism, but the launch runs FSDP1 ({where}): "
            f"on a multi-GPU launch {RAISES_FSDP1} (unless the script passes its own FSDP2 plugin); {ADVICE}: "
            f"set `fsdp_version: 2`{_unknown(devices)}"
        )
    return (
        f"{cp} turns on context parallelism, but the launch runs no FSDP ({where}): "
        f"on a multi-GPU launch {RAISES_NONE} (unless the script passes its own FSDP2 plugin); {ADVICE}: use "
        f"`distributed_type: FSDP` with `fsdp_version: 2`{_unknown(devices)}"
    )


def _unknown(devices: bool | None) -> str:
    if devices is not None:
        return ""
    return (
        " (the device count is not in sight: this is what a multi-GPU run raises; on the CPU accelerate rejects "
        "`cp_size > 1` with another ValueError)"
    )


def _where(setting: Setting) -> str:
    return f"{written(setting, where=False)} at {setting_place(setting)}"
