"""One table of launch settings, whichever of the four spellings said them, and the project pass.

A setting (``fsdp_version``, ``use_orig_params``...) can be written as a plugin
keyword, an accelerate config YAML key, an ``accelerate launch`` flag or an
``FSDP_*`` environment variable. The code-side spelling is read by rules from
the facts; the other three are normalised here into ``Setting``s that remember
the file and position that said them, so a rule reports at the right place.
The project pass links each script to the configs and launch lines that run it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from lintdist.sources import ConfigDocument, LaunchCommand, LaunchFile, line_col

ENV_NAMES = {
    "ACCELERATE_USE_FSDP": "use_fsdp",
    "ACCELERATE_USE_DEEPSPEED": "use_deepspeed",
    "ACCELERATE_USE_MEGATRON_LM": "use_megatron_lm",
    "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "gradient_accumulation_steps",
    "ACCELERATE_MIXED_PRECISION": "mixed_precision",
}

# Launch flags (or their environment variables) that choose the backend, and what they choose.
BACKEND_FLAGS = (
    ("use_fsdp", "FSDP"),
    ("use_deepspeed", "DEEPSPEED"),
    ("use_megatron_lm", "MEGATRON_LM"),
    ("tpu", "XLA"),
    ("multi_gpu", "MULTI_GPU"),
)


@dataclass(frozen=True)
class Setting:
    name: str
    value: object
    path: str
    line: int
    column: int
    spelling: str  # "yaml", "flag", "env", or "launcher" (a plain `python` line: one process)


@dataclass
class LaunchSettings:
    """The settings in force for one script, later spellings overriding earlier ones (YAML < env < flag)."""

    values: dict[str, Setting] = field(default_factory=dict)

    def get(self, name: str) -> Setting | None:
        return self.values.get(name)

    def set(self, setting: Setting) -> None:
        self.values[setting.name] = setting

    @property
    def distributed_type(self) -> Setting | None:
        """The backend the launch selects (``FSDP``, ``DEEPSPEED``, ``MULTI_GPU``...), if any spelling says.

        As in ``accelerate launch`` (``_validate_launch_command``), a backend flag wins over the
        config's ``distributed_type``: ``--multi_gpu`` with a DeepSpeed config runs DDP.
        """
        for flag, backend in BACKEND_FLAGS:
            setting = self.values.get(flag)
            # A bare flag (`--use_fsdp`) has no value; a spelled-out one must be true.
            if setting is not None and str(setting.value).lower() in {"true", "1", "none"}:
                return replace(setting, name="distributed_type", value=backend)
        return self.values.get("distributed_type")

    def common(self, other: LaunchSettings) -> LaunchSettings:
        """The settings both launches give the same value (a script launched in two ways)."""
        shared = {k: s for k, s in self.values.items() if k in other.values and other.values[k].value == s.value}
        return LaunchSettings(shared)

    def fingerprint(self) -> tuple:
        return tuple(sorted((k, repr(s.value), s.path, s.line, s.column) for k, s in self.values.items()))


def config_settings(document: ConfigDocument, path: str) -> list[Setting]:
    """Settings of an accelerate config; ``fsdp_config`` keys get the ``fsdp_`` prefix as the launcher adds it."""
    if document.flavour != "accelerate":
        return []
    result = []
    for key, value in document.data.items():
        if key in {"fsdp_config", "deepspeed_config"} and isinstance(value, dict):
            for inner, inner_value in value.items():
                name = inner if key == "deepspeed_config" or inner.startswith("fsdp_") else f"fsdp_{inner}"
                line, column = document.key_position(key, inner) or (1, 1)
                result.append(Setting(name, inner_value, path, line, column, "yaml"))
        else:
            line, column = document.key_position(key) or (1, 1)
            result.append(Setting(str(key), value, path, line, column, "yaml"))
    return result


def command_settings(command: LaunchCommand, launch: LaunchFile, text: str, path: str) -> list[Setting]:
    result = []
    for name, value, token in [*launch.exports, *command.env]:
        normalised = ENV_NAMES.get(name) or (name.lower() if name.startswith("FSDP_") else None)
        if normalised:
            result.append(Setting(normalised, value, path, *line_col(text, token.start), "env"))
    for flag in command.flags:
        result.append(Setting(flag.name, flag.value, path, *line_col(text, flag.token.start), "flag"))
    return result


@dataclass
class Project:
    """Which configs and launch commands run which script."""

    # script path (resolved) -> settings gathered from its launch lines and configs
    links: dict[str, LaunchSettings] = field(default_factory=dict)

    def settings_for(self, script: Path) -> LaunchSettings | None:
        return self.links.get(os.path.realpath(script))


def build_project(
    configs: dict[Path, ConfigDocument],
    launches: dict[Path, tuple[LaunchFile, str]],
    scripts: list[Path],
    default_configs: list[Path],
    display: dict[Path, str],
    load_config,
) -> Project:
    """Link scripts to their settings.

    A script named by a launch line takes that line's flags and the config it
    names (``--config_file``); a plain ``python train.py`` line links it to one
    process (``num_processes`` 1) and nothing else. A script named by several lines keeps what
    they agree on. Otherwise a config from ``accelerate-config`` in the lintdist
    configuration; otherwise the single accelerate config beside it, when the script is the one entry point of
    its folder (no other script there, helpers aside).
    """
    project = Project()

    def add_config(settings: LaunchSettings, config_path: Path) -> None:
        document = configs.get(config_path) or load_config(config_path)
        if document is not None:
            for setting in config_settings(document, display.get(config_path) or os.path.relpath(config_path)):
                settings.set(setting)

    for launch_path, (launch, text) in sorted(launches.items()):
        for command in launch.commands:
            if command.script is None:
                continue
            script = resolve_launch_path(command.script.text, launch_path)
            settings = LaunchSettings()
            config_flag = next((f for f in command.flags if f.name == "config_file" and f.value), None)
            if config_flag is not None:
                add_config(settings, resolve_launch_path(config_flag.value, launch_path))
            for setting in command_settings(command, launch, text, display.get(launch_path, str(launch_path))):
                settings.set(setting)
            if command.launcher == "python":
                # `python train.py` runs one process (unless the script spawns its own: rules check for that)
                line, column = line_col(text, command.script.start)
                settings.set(
                    Setting("num_processes", 1, display.get(launch_path, str(launch_path)), line, column, "launcher")
                )
            key = os.path.realpath(script)
            # A script run by several launch lines keeps only what they all agree on.
            project.links[key] = settings if key not in project.links else project.links[key].common(settings)

    accelerate_configs = [p for p, d in configs.items() if d.flavour == "accelerate"]
    entries: dict[Path, list[Path]] = {}
    for script in scripts:
        key = os.path.realpath(script)
        if key in project.links:
            continue
        folder = script.parent.resolve()
        beside = [p for p in accelerate_configs if p.parent.resolve() == folder]
        if len(beside) == 1 and folder not in entries:
            entries[folder] = _entry_scripts(folder)
        # a lone config is the script's only when the script is the folder's one entry point (its helpers
        # inherit it through their imports): beside several scripts it may be meant for a sibling
        lone = len(beside) == 1 and [p.resolve() for p in entries[folder]] == [script.resolve()]
        chosen = default_configs or (beside if lone else [])
        if chosen:
            settings = LaunchSettings()
            for config_path in chosen:
                add_config(settings, config_path)
            project.links[key] = settings
    return project


def _entry_scripts(folder: Path) -> list[Path]:
    """The folder's Python files that no other file of the folder imports: its scripts, not their helpers."""
    from lintdist.modules import imported_files

    try:
        files = sorted(p for p in folder.iterdir() if p.suffix == ".py" and p.is_file() and p.name != "__init__.py")
    except OSError:
        return []
    imported: set[Path] = set()
    for path in files:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        imported.update(p.resolve() for p in imported_files(path, text))
    return [p for p in files if p.resolve() not in imported]


def resolve_launch_path(name: str, launch_path: Path) -> Path:
    """A path on a launch line: relative to the launch file's folder if it exists there, else to the cwd."""
    candidate = Path(name)
    if candidate.is_absolute():
        return candidate
    beside = launch_path.parent / candidate
    return beside if beside.exists() else candidate
