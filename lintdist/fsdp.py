"""What FSDP a place sets up: the version and options a plugin, an accelerate config, launch flags or the
environment give it, as accelerate 1.15 reads them (``FullyShardedDataParallelPlugin``, ``prepare_multi_gpu_env``)."""

from __future__ import annotations

import libcst as cst

from lintdist.facts import PythonFacts, argument_of
from lintdist.launch import (
    LaunchSettings,
    Setting,
    command_settings,
    config_settings,
    launched_version,
    nothing_launched,
)
from lintdist.loop import FSDP_PLUGINS as PLUGIN_CLASSES
from lintdist.sources import ConfigDocument, LaunchCommand, LaunchFile
from lintdist.values import known_value, python_value

__all__ = ["PLUGIN_CLASSES"]

FSDP1_MIXED_PRECISION = frozenset(
    {
        "torch.distributed.fsdp.MixedPrecision",
        "torch.distributed.fsdp.api.MixedPrecision",
        "torch.distributed.fsdp.fully_sharded_data_parallel.MixedPrecision",
    }
)
FSDP1_CPU_OFFLOAD = frozenset(
    {
        "torch.distributed.fsdp.CPUOffload",
        "torch.distributed.fsdp.api.CPUOffload",
        "torch.distributed.fsdp.fully_sharded_data_parallel.CPUOffload",
    }
)
# The FSDP1 option classes a plugin keyword may be given; their calls are values lintdist reads.
FSDP1_OPTION_CLASSES = FSDP1_MIXED_PRECISION | FSDP1_CPU_OFFLOAD
# accelerate numbers the strategies from 1 in this order (accelerate.utils.constants.FSDP_SHARDING_STRATEGY).
STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
# The first accelerate with FSDP2 (`fsdp_version` appears in `utils/dataclasses.py` at v1.6.0).
FSDP2_ACCELERATE = ">=1.6.0"


def strategy_name(value: object) -> str | None:
    """``SHARD_GRAD_OP`` for "shard_grad_op", 2 or "2"; None for anything that is not a sharding strategy."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return STRATEGIES[value - 1] if 1 <= value <= len(STRATEGIES) else None
    if isinstance(value, str):
        text = value.strip().upper()
        if text.isdigit():
            return strategy_name(int(text))
        return text if text in STRATEGIES else None
    return None


def is_local_state_dict(value: object) -> bool:
    """Whether a state-dict type (a word, its number or an enum's spelling) is ``LOCAL_STATE_DICT``."""
    text = str(value).strip().upper()
    return text in {"LOCAL_STATE_DICT", "2"} or text.endswith(".LOCAL_STATE_DICT")


def normalised_key(key: str) -> str:
    """The launcher's name for an ``fsdp_config`` key: it adds the ``fsdp_`` prefix when missing."""
    return key if key.startswith("fsdp_") else f"fsdp_{key}"


def runs_fsdp(document: ConfigDocument | None) -> bool:
    """Whether an accelerate config runs FSDP (``distributed_type: FSDP``); other tools' YAML never does."""
    return (
        document is not None
        and document.flavour == "accelerate"
        and str(document.data.get("distributed_type", "")).upper() == "FSDP"
    )


def fsdp_section(document: ConfigDocument | None) -> dict | None:
    """The ``fsdp_config`` mapping of an accelerate config that runs FSDP, else None.

    accelerate refuses a config without ``distributed_type``, so a YAML that has ``fsdp_config``
    but no ``distributed_type`` is some other tool's (an axolotl or Trainer config): not judged.
    """
    section = document.data.get("fsdp_config") if runs_fsdp(document) else None
    return section if isinstance(section, dict) else None


def section_options(section: dict | None) -> dict[str, object]:
    """The options of an ``fsdp_config`` mapping by the launcher's names (``fsdp_use_orig_params``)."""
    return {normalised_key(str(k)): v for k, v in section.items()} if section else {}


def config_options(document: ConfigDocument | None) -> dict[str, object]:
    """The FSDP options an accelerate config sets, by the launcher's names; empty unless it runs FSDP."""
    return section_options(fsdp_section(document))


def config_version(section: dict) -> object:
    """The ``fsdp_version`` of an ``fsdp_config`` mapping (either spelling of the key), or None."""
    return next((value for key, value in section.items() if normalised_key(str(key)) == "fsdp_version"), None)


def fsdp_config_settings(document: ConfigDocument, path: str) -> dict[str, Setting]:
    """The ``fsdp_config`` keys of a config as settings, by normalised name; keys merged in from an anchor
    (``<<: *base``) are left out: other sections may share them, so they are the user's to change."""
    return {
        s.name: s
        for s in config_settings(document, path)
        if s.keys[:1] == ("fsdp_config",) and document.key_position(*s.keys) is not None
    }


def launch_settings(text: str, launch: LaunchFile, command: LaunchCommand | None, path: str) -> list[Setting]:
    """The environment and flags of a launch line (the file's exports alone where it has no command)."""
    return command_settings(command or LaunchCommand("none"), launch, text, path)


def plugin_keyword(call: cst.Call, name: str) -> cst.Arg | None:
    """The argument a plugin call gives for keyword ``name``, or None."""
    return next((a for a in call.args if a.keyword is not None and a.keyword.value == name), None)


def plugin_version(
    facts: PythonFacts, call: cst.Call, settings: LaunchSettings | None, source: str
) -> tuple[int | None, Setting | None]:
    """The FSDP version a plugin call runs: its ``fsdp_version`` keyword, else what the launcher exports.

    ``source`` is the script's text. Returns (version, the launch setting it came from).
    None: lintdist cannot tell.
    """
    arg = plugin_keyword(call, "fsdp_version")
    if arg is None and call.args and call.args[0].keyword is None and not call.args[0].star:
        arg = call.args[0]  # fsdp_version is the first field
    if arg is not None:
        value = python_value(known_value(facts, arg.value, FSDP1_OPTION_CLASSES))
        return (value if value in {1, 2} else None), None
    if any(a.star for a in call.args) or "FSDP_VERSION" in source:
        # `*args`/`**kwargs` may carry the version, and a script that names the variable
        # (`os.environ["FSDP_VERSION"] = "2"`) may set it before the plugin reads it
        return None, None
    setting = launched_version(settings)
    if setting is None:
        return (1, None) if nothing_launched(settings) else (None, None)
    version = str(setting.value).strip()
    return (int(version) if version in {"1", "2"} else None), setting


def launched_fsdp(settings: LaunchSettings | None) -> tuple[int | None, Setting] | None:
    """The FSDP version a launch that selects FSDP runs (``distributed_type: FSDP``, ``--use_fsdp``): (1, the backend
    setting) when it says no version (accelerate's default), (1 or 2, the version setting), (None, the setting) for
    another value; None when the launch selects no FSDP or is out of sight."""
    backend = settings.distributed_type if settings is not None else None
    if backend is None or str(backend.value).upper() != "FSDP":
        return None
    setting = launched_version(settings)
    if setting is None:
        return 1, backend
    version = str(setting.value).strip()
    return (int(version) if version in {"1", "2"} else None), setting


def given_plugins(
    facts: PythonFacts, accelerator: cst.Call, settings: LaunchSettings | None, source: str
) -> list[tuple[cst.Call, int | None, Setting | None] | None] | None:
    """The FSDP plugins an ``Accelerator(...)`` call's ``fsdp_plugin=`` can hold, each with the version it runs and
    the launch setting that says so (``plugin_version``), and None for an explicit ``None``; empty when the keyword
    is not given; None when a value is not a plugin built in this module (or nothing is known of it)."""
    value = argument_of(accelerator, "fsdp_plugin", None)
    if value is None:
        return []
    origins = facts.origins(value, accelerator)
    found: list[tuple[cst.Call, int | None, Setting | None] | None] = []
    for origin in origins:
        node = origin.node
        if origin.index is None and isinstance(node, cst.Name) and node.value == "None":
            found.append(None)
        elif origin.index is None and isinstance(node, cst.Call) and facts.callee_is(node, PLUGIN_CLASSES):
            found.append((node, *plugin_version(facts, node, settings, source)))
        else:
            return None
    return found or None


def launch_line_options(command: LaunchCommand, document: ConfigDocument | None) -> dict[str, object]:
    """The FSDP options an ``accelerate launch`` line gives its script, by the launcher's names: the ``fsdp_config``
    of its config (``document``, the one ``--config_file`` names), overridden by its ``--fsdp_*`` flags."""
    return {**config_options(document), **{f.name: f.value for f in command.flags if f.name.startswith("fsdp_")}}
