"""LD309 fsdp-no-auto-wrap: FSDP with no auto-wrap policy shards the model as one unit.

What accelerate 1.15 does, read in its source:

* ``FullyShardedDataParallelPlugin.__post_init__``: ``auto_wrap_policy`` None reads env
  ``FSDP_AUTO_WRAP_POLICY``, else ``"NO_WRAP"``, which becomes None. ``"size_based_wrap"``
  without ``min_num_params`` reads ``FSDP_MIN_NUM_PARAMS``, else 0; ``set_auto_wrap_policy``
  then drops a policy whose ``min_num_params`` is 0 ("If zero, we silently ignore it").
  ``activation_checkpointing`` None reads ``FSDP_ACTIVATION_CHECKPOINTING``, else False.
* ``accelerate launch`` with FSDP exports ``FSDP_AUTO_WRAP_POLICY`` only when a flag or
  config key gives it, but always exports ``FSDP_MIN_NUM_PARAMS`` (flag default 1e8) and
  ``FSDP_ACTIVATION_CHECKPOINTING`` (default false) (``prepare_multi_gpu_env``).
* FSDP2: ``_prepare_fsdp2`` calls ``set_auto_wrap_policy`` and then, with activation
  checkpointing on, ``fsdp2_apply_ac``, which calls the policy function
  ``fsdp2_prepare_auto_wrap_policy`` returned; it is None without a policy, so prepare raises
  ``TypeError: 'NoneType' object is not callable``. ``fsdp2_prepare_model`` shards no layer
  of its own without a policy: only the root (and, for models with ``get_input_embeddings``,
  the input embedding and the final norm with the output head).
* FSDP1: ``prepare_model`` wraps with ``auto_wrap_policy=None`` (one FlatParameter for the
  whole model) and, with activation checkpointing on, calls
  ``apply_activation_checkpointing(auto_wrap_policy=None)``, which checkpoints every submodule.
* transformers' ``Trainer`` builds its own plugin and always passes ``auto_wrap_policy``
  (``TRANSFORMER_BASED_WRAP`` unless ``fsdp_config`` says otherwise), so no plugin call of a
  Trainer script is involved.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from lintdist.facts import argument_of
from lintdist.fsdp import (
    PLUGIN_CLASSES,
    config_version,
    fsdp_section,
    launch_line_options,
    normalised_key,
    plugin_version,
    runs_fsdp,
    section_options,
)
from lintdist.launch import (
    LaunchSettings,
    Setting,
    accelerate_runs_fsdp,
    linked_config,
    resolve_launch_path,
    setting_span,
    top_key_setting,
)
from lintdist.model import Severity, Span
from lintdist.rule import Invalid, Rule, Valid
from lintdist.sources import LaunchCommand, SourceError, line_col, read_source, shell_tokens
from lintdist.values import BOOL_WORDS, known_value, python_value

POLICIES = frozenset({"TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"})
LAUNCHER_MIN_NUM_PARAMS = int(1e8)  # `accelerate launch --fsdp_min_num_params` default, always exported
TRUE_WORDS = frozenset({"y", "yes", "t", "true", "on", "1"})
# The plugin field order (a dataclass): `auto_wrap_policy` is the sixth.
POLICY_POSITION = 5
# A script that names these may set the policy itself (its own plugin, a Trainer's `fsdp_config`, the variable).
# (A Trainer script without `fsdp=` takes the launcher's plugin, policy and all: it is not such a script.)
SCRIPT_POLICY = re.compile(r"auto_wrap_policy|AUTO_WRAP_POLICY|fsdp_config|\bfsdp\s*=")
MAX_SIBLINGS = 50
UNKNOWN = object()


@dataclass(frozen=True)
class Wrapping:
    """What one FSDP setup says about wrapping. ``policy``: an upper-case policy name, None when absent,
    UNKNOWN when lintdist cannot read it (a function, an expression); ``min_num_params`` and ``checkpointing``
    likewise; ``version``: 1, 2 or None (unknown)."""

    policy: object
    min_num_params: object
    checkpointing: object
    version: int | None
    launcher_default: bool  # `accelerate launch` runs FSDP, so it exports FSDP_MIN_NUM_PARAMS (1e8 by default)


def judge(wrapping: Wrapping, *, spelled: str) -> tuple[Severity, str] | None:
    """The finding for one setup, or None. ``spelled`` names where a policy goes (`auto_wrap_policy=...`)."""
    policy = wrapping.policy
    if policy is UNKNOWN or policy == "TRANSFORMER_BASED_WRAP":
        return None
    advice = f"set {spelled}"
    if policy == "SIZE_BASED_WRAP":
        minimum = wrapping.min_num_params
        if minimum is None:
            minimum = LAUNCHER_MIN_NUM_PARAMS if wrapping.launcher_default else 0
        if not isinstance(minimum, int) or minimum > 0:
            return None
        given = "with `min_num_params` 0"
        if wrapping.min_num_params is None:
            given = "without `min_num_params` (nor `FSDP_MIN_NUM_PARAMS`) reads 0"
        why = f"`size_based_wrap` {given}, and accelerate then drops the policy silently (`set_auto_wrap_policy`)"
        advice = "set `min_num_params` (e.g. 100_000_000) or use `transformer_based_wrap`"
    elif policy == "NO_WRAP":
        why = "`NO_WRAP` is set"
    else:
        why = "no auto-wrap policy is given, and accelerate's default is `NO_WRAP`"
    checkpointing = wrapping.checkpointing is True
    if checkpointing and wrapping.version == 2:
        return Severity.ERROR, (
            f"FSDP2 with activation checkpointing and no wrap policy: {why}, so `fsdp2_apply_ac` calls a None "
            f"policy and `accelerator.prepare` raises TypeError ('NoneType' object is not callable); {advice}"
        )
    if policy == "NO_WRAP":
        return None  # a deliberate choice, harmless without activation checkpointing
    extra = ""
    if checkpointing and wrapping.version == 1:
        extra = "; activation checkpointing then wraps every submodule, nested, recomputing inner layers again"
    return Severity.WARNING, (
        f"FSDP shards the model as one unit: {why}, so every layer is all-gathered at once in forward and "
        f"backward and peak memory holds the whole unsharded model{extra}; {advice}"
    )


def truth(value: object) -> object:
    """A boolean setting as accelerate's ``str_to_bool`` reads it; None when absent, UNKNOWN for anything else."""
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    return text in TRUE_WORDS if text in BOOL_WORDS else UNKNOWN


def integer(value: object) -> object:
    """A count as accelerate reads it (``1e8`` too); None when absent, UNKNOWN for anything else."""
    if isinstance(value, bool):
        return UNKNOWN
    if value is None or isinstance(value, int):
        return value
    try:
        return int(float(str(value).strip()))
    except ValueError:
        return UNKNOWN


def policy_name(value: object) -> object:
    if value is None:
        return None
    text = str(value).strip().upper()
    if "$" in text or "`" in text:
        return UNKNOWN
    return text if text in POLICIES else UNKNOWN


class FsdpNoAutoWrap(Rule):
    """
    ## What it does
    Reports FSDP set up without an auto-wrap policy: a
    `FullyShardedDataParallelPlugin(...)` without `auto_wrap_policy`, an
    accelerate config with `distributed_type: FSDP` and no
    `fsdp_auto_wrap_policy`, an `accelerate launch --use_fsdp` line without
    `--fsdp_auto_wrap_policy`, or `ACCELERATE_USE_FSDP=true` on a `torchrun`
    line without `FSDP_AUTO_WRAP_POLICY`, when no other spelling that reaches
    the run supplies one. `size_based_wrap` whose `min_num_params` reads 0 is
    reported too (`accelerate launch` always exports `FSDP_MIN_NUM_PARAMS`,
    1e8 by default, so there it does not read 0). A plugin is reported at its
    call, a config at its `fsdp_config` key (or `distributed_type`), a launch
    line at `--use_fsdp` or `ACCELERATE_USE_FSDP=true`.

    A plugin reads every setting it leaves out from the launcher's
    environment, so a plugin without `auto_wrap_policy` is judged only when
    the launch that runs the script is in sight (a launch file or config of
    the project); nor when the script assigns the attribute itself
    (`accelerator.state.fsdp_plugin.auto_wrap_policy = ...`). A config or
    launch line is not reported when the script beside it, or on it, builds
    its own plugin with a policy (or passes the Trainer an `fsdp_config`).

    ## Why is this bad?
    accelerate's default policy is `NO_WRAP`: the whole model becomes one FSDP
    unit (FSDP1: one flat parameter; FSDP2: only the root, plus the embedding
    and output head of a transformers model). Each forward and backward then
    all-gathers every parameter at once, so peak memory holds the full
    unsharded model and communication cannot overlap with compute: sharding
    saves optimizer and gradient memory but not parameter memory. It is a
    warning. Under FSDP2 with activation checkpointing on
    (`activation_checkpointing=True`, `fsdp_activation_checkpointing: true`),
    it is an error: `fsdp2_apply_ac` calls the policy function, which is None,
    and `accelerator.prepare` raises `TypeError: 'NoneType' object is not
    callable`. The same happens with `size_based_wrap` whose
    `min_num_params` reads 0, which accelerate drops without a word.

    transformers' `Trainer` (`TrainingArguments(fsdp=..., fsdp_config=...)`)
    builds its own plugin with `TRANSFORMER_BASED_WRAP` by default, so it is
    not reported; an explicit `NO_WRAP` is reported only with activation
    checkpointing under FSDP2.

    ## Example
    ```python
    # launched with `torchrun`: no FSDP_* variable supplies a policy
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, activation_checkpointing=True)
    accelerator = Accelerator(fsdp_plugin=plugin)
    ```

    ## Use instead
    ```python
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, activation_checkpointing=True, auto_wrap_policy="transformer_based_wrap"
    )
    accelerator = Accelerator(fsdp_plugin=plugin)
    ```
    `transformer_based_wrap` wraps the model's `_no_split_modules` (a
    transformers model) or `transformer_cls_names_to_wrap`; for another model,
    name its block class there, or use `size_based_wrap` with `min_num_params`.

    ## Fix safety
    No fix: which layers to wrap depends on the model (a transformers model
    names them in `_no_split_modules`; another model needs its block class).

    ## References
    - accelerate `FullyShardedDataParallelPlugin.__post_init__` and `set_auto_wrap_policy`
      (`accelerate/utils/dataclasses.py`)
    - accelerate `fsdp2_prepare_model`, `fsdp2_apply_ac`, `fsdp2_prepare_auto_wrap_policy`
      (`accelerate/utils/fsdp_utils.py`), `Accelerator._prepare_fsdp2` and `prepare_model`
    - accelerate `prepare_multi_gpu_env` (`accelerate/utils/launch.py`): the `FSDP_*` variables the launcher exports
    - transformers `TrainingArguments._process_fsdp_args` (the Trainer's plugin and its default policy)
    """

    code = "LD309"
    name = "fsdp-no-auto-wrap"
    severity = Severity.WARNING
    fix_kind = "none"
    kinds = frozenset({"python", "config", "launch"})
    triggers = ("FullyShardedDataParallelPlugin", "fsdp", "FSDP")
    python_triggers = ("FullyShardedDataParallelPlugin",)

    VALID = (
        Valid(
            """\
from accelerate import Accelerator, FullyShardedDataParallelPlugin

plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap")
accelerator = Accelerator(fsdp_plugin=plugin)
"""
        ),
        Valid(
            """\
import functools

from accelerate import Accelerator, FullyShardedDataParallelPlugin
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy

policy = functools.partial(size_based_auto_wrap_policy, min_num_params=10_000)
accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(auto_wrap_policy=policy))
"""
        ),
        Valid(
            """\
from transformers import Trainer, TrainingArguments

args = TrainingArguments("out", fsdp="full_shard", fsdp_config={"activation_checkpointing": True})
Trainer(model=model, args=args, train_dataset=dataset).train()
"""
        ),
        Valid(
            """\
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_activation_checkpointing: true
""",
            filename="config.yaml",
        ),
        Valid(
            "accelerate launch --use_fsdp --fsdp_auto_wrap_policy SIZE_BASED_WRAP --num_processes 2 train.py\n",
            filename="launch.sh",
        ),
    )
    INVALID = (
        Invalid(
            """\
from accelerate import Accelerator, FullyShardedDataParallelPlugin

plugin = FullyShardedDataParallelPlugin(fsdp_version=2, activation_checkpointing=True)
accelerator = Accelerator(fsdp_plugin=plugin)
""",
            lines=(3,),
            project={"launch.sh": "torchrun --nproc_per_node 8 train.py\n"},
        ),
        Invalid(
            """\
from accelerate import Accelerator
from accelerate.utils import FullyShardedDataParallelPlugin

accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(auto_wrap_policy="size_based_wrap"))
""",
            lines=(4,),
            project={"launch.sh": "torchrun --nproc_per_node 8 train.py\n"},
        ),
        Invalid(
            """\
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
  fsdp_reshard_after_forward: true
num_processes: 8
""",
            lines=(3,),
            filename="config.yaml",
        ),
        Invalid(
            "accelerate launch --use_fsdp --fsdp_version 2 --num_processes 8 train.py\n",
            lines=(1,),
            filename="launch.sh",
        ),
    )

    # -- Python -----------------------------------------------------------------------------------

    def check_python(self) -> None:
        facts = self.facts
        backend = self.context.settings.distributed_type if self.context.settings is not None else None
        if backend is not None and str(backend.value).upper() == "DEEPSPEED":
            return  # DeepSpeed wins over a plugin built in code (`AcceleratorState`)
        for call in facts.calls:
            if facts.callee_is(call, PLUGIN_CLASSES):
                wrapping = self._plugin_wrapping(call)
                found = judge(
                    wrapping,
                    spelled='`auto_wrap_policy="transformer_based_wrap"` (it wraps a transformers model\'s '
                    "`_no_split_modules`; name another model's block class in `transformer_cls_names_to_wrap`)",
                )
                if found is not None:
                    severity, message = found
                    self.report(call, message, severity=severity)

    def _plugin_wrapping(self, call: cst.Call) -> Wrapping | None:
        """What a plugin call says, filled in from the launch that runs the script. A setting the plugin leaves
        out is read from the environment, so with no launch in sight (the script may run under an accelerate
        config lintdist does not see) it is unknown."""
        facts = self.facts
        text = self.context.text
        settings = self.context.settings
        keywords = {arg.keyword.value: arg.value for arg in call.args if arg.keyword is not None}
        starred = any(arg.star for arg in call.args)
        launcher = _accelerate_fsdp(settings)

        def field(name: str, position: int | None = None) -> object:
            """The keyword's literal value (UNKNOWN for any other expression), else the launch's, else None."""
            expr = keywords.get(name)
            if expr is None and position is not None and not starred:
                expr = argument_of(call, name, position)
            if expr is not None:
                value = _literal(facts, expr)
                if value is not None:
                    return value
            elif starred:
                return UNKNOWN  # `**options` may carry it
            if settings is None or f"FSDP_{name.upper()}" in text or re.search(rf"\.{name}\s*=(?!=)", text):
                # the launch is out of sight, or the script sets the variable or the plugin's attribute itself
                # (`accelerator.state.fsdp_plugin.auto_wrap_policy = ...`)
                return UNKNOWN
            return _launched(settings, normalised_key(name), launcher)

        return Wrapping(
            policy=policy_name(field("auto_wrap_policy", POLICY_POSITION)),
            min_num_params=integer(field("min_num_params")),
            checkpointing=truth(field("activation_checkpointing")),
            version=plugin_version(facts, call, settings, text)[0],
            launcher_default=launcher,
        )

    # -- accelerate config ------------------------------------------------------------------------

    def check_config(self, document) -> None:
        if not runs_fsdp(document):
            return
        section = fsdp_section(document)
        options = section_options(section)
        wrapping = _options_wrapping(options, launcher_default=True, version=config_version(section or {}))
        found = judge(
            wrapping,
            spelled="`fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP` in `fsdp_config` (with "
            "`fsdp_transformer_layer_cls_to_wrap` for a model that is not from transformers)",
        )
        if found is None or self._sibling_decides():
            return
        severity, message = found
        path = self.context.display_name
        key = top_key_setting(document, "fsdp_config", path) if section is not None else None
        key = key or top_key_setting(document, "distributed_type", path)
        if key is None:  # merged in from an anchor (`<<: *base`), written nowhere: the first line stands for it
            key = Setting("distributed_type", None, path, 1, 1, "yaml")
        self.report(None, message, severity=severity, span=setting_span(self.context.text, key))

    # -- launch files -----------------------------------------------------------------------------

    def check_launch(self, launch) -> None:
        reported: set[Span] = set()
        for command in launch.commands:
            env = {name: (value, token) for name, value, token in [*launch.exports, *command.env]}
            if command.launcher == "accelerate":
                document, _ = linked_config(command, self.context.path)
                if accelerate_runs_fsdp(command, document) is not True:
                    continue
                if document is not None and str(document.data.get("distributed_type", "")).upper() == "FSDP":
                    continue  # the config is reported itself
                flag = next((f for f in command.flags if f.name == "use_fsdp"), None)
                if flag is None:
                    continue
                # the launcher overwrites every other FSDP_* variable with its flags' values (or their defaults)
                options = (
                    {"fsdp_auto_wrap_policy": env["FSDP_AUTO_WRAP_POLICY"][0]} if "FSDP_AUTO_WRAP_POLICY" in env else {}
                )
                options.update(launch_line_options(command, document))
                wrapping = _options_wrapping(options, launcher_default=True, version=options.get("fsdp_version"))
                span = self._span(flag.token.start, flag.token.end)
                spelled = (
                    "`--fsdp_auto_wrap_policy TRANSFORMER_BASED_WRAP` (with `--fsdp_transformer_layer_cls_to_wrap` "
                    "for a model that is not from transformers)"
                )
            elif command.launcher == "torchrun":
                # `Accelerator()` builds its plugin from the environment (FSDP on a multi-GPU launch only)
                use = env.get("ACCELERATE_USE_FSDP")
                if use is None or truth(use[0]) is not True:
                    continue
                if truth(env.get("ACCELERATE_USE_DEEPSPEED", ("false",))[0]) is True:
                    continue  # DeepSpeed wins in AcceleratorState
                options = {name.lower(): value for name, (value, _) in env.items() if name.startswith("FSDP_")}
                wrapping = _options_wrapping(options, launcher_default=False, version=options.get("fsdp_version"))
                span = self._span(use[1].start, use[1].end)
                spelled = (
                    "`FSDP_AUTO_WRAP_POLICY=TRANSFORMER_BASED_WRAP` (with `FSDP_TRANSFORMER_CLS_TO_WRAP` for a model "
                    "that is not from transformers)"
                )
            else:
                continue
            if self._script_decides(command):
                continue
            found = judge(wrapping, spelled=spelled)
            if found is not None and span not in reported:  # an `export` read by several commands: once
                reported.add(span)
                severity, message = found
                self.report(None, message, severity=severity, span=span)

    def _script_decides(self, command: LaunchCommand) -> bool:
        """The script may build its own plugin with a policy (or a Trainer's): its text says so, or its
        arguments on the launch line pass `--fsdp`/`--fsdp_config`; an unreadable script decides nothing."""
        if command.script is None:
            return True
        for words in shell_tokens(self.context.text):
            if any(word.start == command.script.start for word in words):
                after = [w.text for w in words if w.start > command.script.start]
                if any(w.split("=", 1)[0].lstrip("-").replace("-", "_") in {"fsdp", "fsdp_config"} for w in after):
                    return True
        return self._mentions_policy(resolve_launch_path(command.script.text, Path(self.context.path)))

    def _sibling_decides(self) -> bool:
        """A script beside the config builds its own plugin with a policy (or a Trainer's `fsdp_config`):
        the config is likely its launch config, whose policy the plugin overrides."""
        folder = Path(self.context.path).parent
        try:
            scripts = sorted(folder.glob("*.py"))[:MAX_SIBLINGS]
        except OSError:
            return False
        return any(self._mentions_policy(script) for script in scripts)

    def _mentions_policy(self, script: Path) -> bool:
        try:
            text = read_source(script, "python").text
        except (SourceError, OSError):
            return False
        self.context.dependencies.append(script)
        return SCRIPT_POLICY.search(text) is not None

    def _span(self, start: int, end: int) -> Span:
        return Span(*line_col(self.context.text, start), *line_col(self.context.text, end))


# -- helpers --------------------------------------------------------------------------------------


def _options_wrapping(options: dict[str, object], *, launcher_default: bool, version: object) -> Wrapping:
    """The wrapping of launch-side options (normalised ``fsdp_*`` names, YAML or shell values)."""
    version_number = integer(version) if version is not None else 1
    return Wrapping(
        policy=policy_name(options.get("fsdp_auto_wrap_policy")),
        min_num_params=integer(options.get("fsdp_min_num_params")),
        checkpointing=truth(options.get("fsdp_activation_checkpointing")),
        version=version_number if version_number in (1, 2) else None,
        launcher_default=launcher_default,
    )


def _accelerate_fsdp(settings: LaunchSettings | None) -> bool:
    """``accelerate launch`` runs FSDP for the script (a config or flag selects it), so it exports the
    ``FSDP_*`` variables of its flags and config."""
    backend = settings.distributed_type if settings is not None else None
    return backend is not None and backend.spelling in {"yaml", "flag"} and str(backend.value).upper() == "FSDP"


def _launched(settings: LaunchSettings, name: str, launcher: bool) -> object:
    """A launch-side setting that reaches a plugin built in code: a YAML key or flag only through an
    ``accelerate launch`` that runs FSDP, a variable always. None when absent."""
    setting = settings.get(name)
    if setting is None:
        return None
    if setting.spelling in {"yaml", "flag"} and not launcher:
        return None
    value = setting.value
    if isinstance(value, str) and ("$" in value or "`" in value):
        return UNKNOWN
    return value


def _literal(facts, expr: cst.BaseExpression) -> object:
    """A keyword's value: a string, number or boolean literal (through names bound once), None for a
    literal None, UNKNOWN otherwise."""
    node = known_value(facts, expr)
    if isinstance(node, cst.Float):
        return int(node.evaluated_value) if node.evaluated_value.is_integer() else UNKNOWN
    value = python_value(node)
    return UNKNOWN if node is None or isinstance(value, cst.CSTNode) else value
