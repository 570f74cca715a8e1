"""LD302 prefer-fsdp2: FSDP1 in use (raw wrapper, accelerate config, launch flag or plugin) where FSDP2 is available.

The conversion asks ``lintdist.fsdp2_options`` as LD301 does: it is exactly "set version 2 and
apply every LD301 repair at once", so LD301 has nothing left to say afterwards,
and a file LD301 could not repair completely is not converted at all.
"""

from __future__ import annotations

import libcst as cst

from lintdist.edits import with_arg_changes, with_keyword
from lintdist.fsdp import (
    FSDP2_ACCELERATE,
    PLUGIN_CLASSES,
    config_options,
    config_version,
    fsdp_config_settings,
    fsdp_section,
    launch_line_options,
    plugin_version,
    runs_fsdp,
    section_options,
)
from lintdist.fsdp2_options import judge_plugin, repair_all, unreadable_option
from lintdist.launch import (
    Setting,
    accelerate_runs_fsdp,
    add_setting,
    command_settings,
    edit_setting,
    key_line,
    linked_config,
    setting_span,
    top_key_setting,
)
from lintdist.model import Applicability, Fix, Severity, Span, TextEdit
from lintdist.rule import Invalid, Rule, Valid
from lintdist.sources import LaunchCommand

RAW_FSDP = frozenset(
    {
        "torch.distributed.fsdp.FullyShardedDataParallel",
        "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel",
    }
)
WHY = (
    "FSDP2 (`fully_shard`) is the maintained path: per-parameter DTensor sharding, no flat parameters, "
    "simpler frozen-parameter and mixed-precision handling"
)
FIX_MESSAGE = "Convert to FSDP2 (as `accelerate to-fsdp2` does)"


class PreferFsdp2(Rule):
    """
    ## What it does
    Reports FSDP1 in use: a raw `FullyShardedDataParallel(...)` wrapper, an
    accelerate config with `distributed_type: FSDP` and no `fsdp_version: 2`,
    an `accelerate launch --use_fsdp` line without `--fsdp_version 2`, and a
    `FullyShardedDataParallelPlugin(...)` that runs FSDP1 (no `fsdp_version=2`
    and no launch setting that exports it). The report points at the
    `fsdp_version` key, flag or keyword when it says 1, else at the
    `fsdp_config` key, the `--use_fsdp` flag or the plugin call. Off by
    default: enable it with `extend-select = ["LD302"]`.

    ## Why is this bad?
    It is not a bug. FSDP1 is in maintenance, while FSDP2 is where new work
    lands (DTensor checkpoints, `torch.compile` and tensor-parallel
    composition, `MixedPrecisionPolicy`, per-module resharding). accelerate
    still defaults to FSDP1, so configs written by `accelerate config` keep
    running it. Moving early avoids converting checkpoints later.

    ## Example
    ```yaml
    distributed_type: FSDP
    fsdp_config:
      fsdp_sharding_strategy: SHARD_GRAD_OP
      fsdp_use_orig_params: true
      fsdp_state_dict_type: SHARDED_STATE_DICT
    ```

    ## Use instead
    ```yaml
    distributed_type: FSDP
    fsdp_config:
      fsdp_version: 2
      fsdp_reshard_after_forward: false
      fsdp_state_dict_type: SHARDED_STATE_DICT
    ```

    ## Fix safety
    Unsafe (`--unsafe-fixes`): the conversion changes behaviour. Parameters
    become DTensors, the default checkpoint format becomes SHARDED, and
    `accelerator.prepare` must then receive the model and optimizer together.
    The fix mirrors `accelerate to-fsdp2`: it sets `fsdp_version` to 2, drops
    the FSDP1-only options, and maps `sharding_strategy` to
    `reshard_after_forward` (`FULL_SHARD` and `HYBRID_SHARD` become true, the
    others false). In Python it adds `fsdp_version=2` to the plugin call. There
    is no fix for a raw `FullyShardedDataParallel` (use
    `torch.distributed.fsdp.fully_shard`), nor where the converted options would
    still be invalid under FSDP2 (`LOCAL_STATE_DICT`, an FSDP1 `MixedPrecision`,
    a value lintdist cannot read), nor for a launch line whose `--config_file`
    still holds FSDP1 options (the config's own conversion covers both).

    ## References
    - [accelerate: FSDP1 vs FSDP2](https://huggingface.co/docs/accelerate/concept_guides/fsdp1_vs_fsdp2)
    - `accelerate to-fsdp2` (`accelerate/commands/to_fsdp2.py`, `convert_config_to_fsdp2`)
    - [PyTorch: getting started with FSDP2](https://docs.pytorch.org/tutorials/intermediate/FSDP_tutorial.html)
    """

    code = "LD302"
    name = "prefer-fsdp2"
    severity = Severity.INFO
    default_enabled = False
    fix_kind = "unsafe"
    kinds = frozenset({"python", "config", "launch"})
    triggers = ("FullyShardedDataParallel", "FSDP", "fsdp")
    python_triggers = ("FullyShardedDataParallel",)  # the raw wrapper or accelerate's plugin

    VALID = (
        Valid(
            """\
import torch
from torch.distributed.fsdp import fully_shard

model = torch.nn.Linear(8, 8)
for layer in model.modules():
    fully_shard(layer)
"""
        ),
        Valid(
            """\
from accelerate import Accelerator, FullyShardedDataParallelPlugin

accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
"""
        ),
        Valid(
            """\
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
  fsdp_reshard_after_forward: true
""",
            filename="config.yaml",
        ),
        Valid("distributed_type: MULTI_GPU\nnum_processes: 2\n", filename="config.yaml"),
        Valid("accelerate launch --use_fsdp --fsdp_version 2 train.py\n", filename="launch.sh"),
    )
    INVALID = (
        Invalid(
            """\
import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

model = FSDP(torch.nn.Linear(8, 8))
""",
            lines=(4,),
        ),
        Invalid(
            """\
from accelerate import Accelerator
from accelerate.utils import FullyShardedDataParallelPlugin

plugin = FullyShardedDataParallelPlugin(sharding_strategy="SHARD_GRAD_OP", use_orig_params=True)
accelerator = Accelerator(fsdp_plugin=plugin)
""",
            lines=(4,),
            unsafe_fixed="""\
from accelerate import Accelerator
from accelerate.utils import FullyShardedDataParallelPlugin

plugin = FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward=False)
accelerator = Accelerator(fsdp_plugin=plugin)
""",
        ),
        Invalid(
            """\
distributed_type: FSDP
fsdp_config:  # written by accelerate config
  fsdp_sharding_strategy: FULL_SHARD
  fsdp_sync_module_states: true
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_version: 1
""",
            lines=(6,),
            unsafe_fixed="""\
distributed_type: FSDP
fsdp_config:  # written by accelerate config
  fsdp_reshard_after_forward: true
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_version: 2
""",
            filename="config.yaml",
        ),
        Invalid(
            """\
accelerate launch --use_fsdp \\
  --fsdp_backward_prefetch BACKWARD_PRE \\
  train.py
""",
            lines=(1,),
            unsafe_fixed="""\
accelerate launch --use_fsdp --fsdp_version 2 \\
  train.py
""",
            filename="launch.sh",
        ),
    )

    def finish(self) -> None:
        if self.versions.allows("accelerate", FSDP2_ACCELERATE) is not False:  # else `fsdp_version` means nothing
            super().finish()

    def check_launch(self, launch) -> None:
        for command in launch.commands:
            if command.launcher == "accelerate":
                self._check_command(command)

    # -- Python -----------------------------------------------------------------------------------

    def check_python(self) -> None:
        facts = self.facts
        for call in facts.calls:
            if facts.callee_is(call, RAW_FSDP):
                message = (
                    f"`FullyShardedDataParallel` is FSDP1. {WHY}; wrap the submodules, then the root, with "
                    "`torch.distributed.fsdp.fully_shard(module)`"
                )
                self.report(call, message)
            elif facts.callee_is(call, PLUGIN_CLASSES):
                self._check_plugin(call)

    def _check_plugin(self, call: cst.Call) -> None:
        version, setting = plugin_version(self.facts, call, self.context.settings, self.context.text)
        if version != 1:
            return
        arg = next((a for a in call.args if a.keyword is not None and a.keyword.value == "fsdp_version"), None)
        if arg is None and call.args and call.args[0].keyword is None:
            return  # the version passed by position: rare enough to leave alone
        said = "`fsdp_version=1`" if arg is not None else _absent(setting)
        message = f"This plugin runs FSDP1 ({said}). {WHY}; pass `fsdp_version=2`"
        self.report(arg or call, message, fix=self._plugin_fix(call, arg))

    def _plugin_fix(self, call: cst.Call, version_arg: cst.Arg | None) -> Fix | None:
        if any(a.star for a in call.args) or any(unreadable_option(self.facts, a) for a in call.args):
            return None
        changes: dict[int, cst.Arg | None] = {}
        for problem in judge_plugin(self.facts, call):
            removable = problem.replacement is None and problem.fixable
            if not problem.fixable or not (problem.certain or removable):
                return None  # FSDP2 would still reject or ignore something the fix cannot rewrite
            changes[id(problem.arg)] = problem.replacement
        two = cst.Integer("2")
        if version_arg is not None:
            changes[id(version_arg)] = version_arg.with_changes(value=two)
            return _python_fix(call, with_arg_changes(call, changes))
        return _python_fix(call, with_keyword(with_arg_changes(call, changes), "fsdp_version", two))

    # -- accelerate config ------------------------------------------------------------------------

    def check_config(self, document) -> None:
        if not runs_fsdp(document):
            return
        text = self.context.text
        section = fsdp_section(document)
        version = config_version(section) if section is not None else None
        if version is not None and str(version).strip() != "1":
            return
        path = self.context.display_name
        settings = fsdp_config_settings(document, path)
        if "fsdp_version" in settings:
            where, said = settings["fsdp_version"], "`fsdp_version: 1`"
        elif section is not None:
            where, said = top_key_setting(document, "fsdp_config", path), "no `fsdp_version`, so 1"
        else:
            where, said = top_key_setting(document, "distributed_type", path), "no `fsdp_config`, so version 1"
        message = (
            f"This config runs FSDP1 ({said}). {WHY}; set `fsdp_version: 2` "
            "(`accelerate to-fsdp2 --config_file ...` converts the rest)"
        )
        fix = self._config_fix(section, settings) if where is not None else None
        span = setting_span(text, where) if where is not None else Span(1, 1, 1, 1)
        self.report(None, message, fix=fix, span=span)

    def _config_fix(self, section: dict | None, settings: dict[str, Setting]) -> Fix | None:
        document, text = self.context.config, self.context.text
        # every key joins the judgement; one merged in from an anchor has no setting here, so no repair
        written = {name: s.raw for name, s in settings.items()}
        edits = repair_all(text, section_options(section), settings, lambda n: written.get(n, n), yaml=True)
        if edits is None:
            return None
        if "fsdp_version" in settings:
            edit = edit_setting(text, settings["fsdp_version"], value=2)
            if not edit:
                return None
            return Fix(Applicability.UNSAFE, FIX_MESSAGE, edits=(*edits, *edit))
        if section is None and "fsdp_config" in document.data:
            return None  # `fsdp_config:` with no mapping: a second key would be a duplicate
        if section is not None:
            # the version goes first in the mapping, in the style of its first key
            first = next((s for s in settings.values() if s.editable), None)
            if first is None or section.fa.flow_style():
                return None  # merged in from an anchor, or an empty or flow-style mapping: leave it to the user
            addition = add_setting(text, first, "fsdp_version", 2, before=True)
            return Fix(Applicability.UNSAFE, FIX_MESSAGE, edits=(*edits, *addition)) if addition else None
        backend = top_key_setting(document, "distributed_type", self.context.display_name)
        entry = key_line(text, backend.line) if backend is not None else None
        if entry is None:
            return None
        newline = "\r\n" if text.startswith("\r", entry.end) else "\n"
        edits.append(TextEdit(entry.end, entry.end, f"{newline}fsdp_config:{newline}  fsdp_version: 2"))
        return Fix(Applicability.UNSAFE, FIX_MESSAGE, edits=tuple(edits))

    # -- launch files -----------------------------------------------------------------------------

    def _check_command(self, command: LaunchCommand) -> None:
        text = self.context.text
        settings = command_settings(command, self.context.launch, text, self.context.display_name)
        flags = {s.name: s for s in settings if s.spelling == "flag"}
        use_fsdp = flags.get("use_fsdp")
        version_flag = flags.get("fsdp_version")
        document, _ = linked_config(command, self.context.path)
        if accelerate_runs_fsdp(command, document) is False:
            return  # another backend: the FSDP flags do nothing
        if version_flag is not None:
            if str(version_flag.value).strip() != "1":
                return
            where, said = version_flag, f"`--{version_flag.raw} 1`"
        elif use_fsdp is not None and use_fsdp.value is None and "fsdp_version" not in config_options(document):
            where, said = use_fsdp, "no `--fsdp_version`, so 1"
        else:
            return  # the config says the version, and its own check reports it
        message = f"This launch runs FSDP1 ({said}). {WHY}; pass `--fsdp_version 2`"
        fix = self._command_fix(flags, launch_line_options(command, document), use_fsdp, version_flag)
        self.report(None, message, fix=fix, span=setting_span(text, where))

    def _command_fix(self, flags: dict[str, Setting], options: dict, use_fsdp, version_flag) -> Fix | None:
        text = self.context.text
        fsdp_flags = {name: s for name, s in flags.items() if name.startswith("fsdp_")}
        # A problem with a key of the linked config gives no fix: converting the config is that file's fix.
        # Converting only this line would run the config's FSDP1 options under FSDP2 (or leave it for other lines).
        edits = repair_all(text, options, fsdp_flags, str, yaml=False)
        if edits is None:
            return None
        if version_flag is not None:
            edits.extend(edit_setting(text, version_flag, value=2))
        else:
            # inserted last: an edit that starts at the same offset must be applied first
            edits.extend(add_setting(text, use_fsdp, "fsdp_version", 2))
        return Fix(Applicability.UNSAFE, FIX_MESSAGE, edits=tuple(edits))


def _python_fix(call: cst.Call, new_call: cst.Call) -> Fix:
    return Fix(
        Applicability.UNSAFE, "Pass `fsdp_version=2` and convert the FSDP1 options", replacements=((call, new_call),)
    )


def _absent(setting: Setting | None) -> str:
    return "no `fsdp_version`, so 1" if setting is None else f"`fsdp_version` 1 from {setting.path}:{setting.line}"
