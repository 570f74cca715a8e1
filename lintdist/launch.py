"""One table of launch settings, whichever spelling said them, their edits, and the project pass.

A setting (``fsdp_version``, ``cp_size``, ``gradient_accumulation_steps``...) can be
written as a plugin keyword in code, an accelerate config YAML key, an ``accelerate
launch`` flag (either spelling) or an environment variable. Each spelling is
normalised here into ``Setting``s that remember the file, the position and the
words that said them, so a rule reports at the right place and repairs the setting
in its own spelling with one call (``edit_setting``, ``add_setting``): YAML edits
touch only the key's line (comments, order and quoting of the rest are kept),
shell edits keep continuations and quoting, Python edits are keyword edits
(``lintdist.edits``).

Precedence, as accelerate 1.15 applies it: a plugin built in code wins over a
launch flag, a flag over an environment variable, and a variable over the YAML
config; a plugin built in code without a keyword reads the launcher's
``FSDP_*``/``ACCELERATE_*`` environment, so it inherits the launch's value
(``in_force`` has the exceptions).
The project pass links each script to the configs and launch lines that run it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from lintdist.model import TextEdit
from lintdist.sources import (
    ConfigDocument,
    LaunchCommand,
    LaunchFile,
    SourceError,
    Token,
    launch_text,
    line_col,
    parse_config,
    parse_launch,
    read_source,
)

ENV_NAMES = {
    "ACCELERATE_USE_CPU": "cpu",
    "ACCELERATE_DEEPSPEED_ZERO_STAGE": "zero_stage",
    "ACCELERATE_GRADIENT_CLIPPING": "gradient_clipping",
    "ACCELERATE_USE_PARALLELISM_CONFIG": "use_parallelism_config",
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
    """One setting as one file says it, with what an edit in its own spelling needs."""

    name: str  # normalised: the flag name (``fsdp_use_orig_params``, ``parallelism_config_cp_size``)
    value: object
    path: str
    line: int
    column: int
    spelling: str  # "yaml", "flag", "env", "python", or "launcher" (a plain `python` line: one process)
    raw: str = ""  # as written: the YAML key, the flag word's name, the variable, the keyword
    keys: tuple[str, ...] = ()  # YAML: the key path (``("fsdp_config", "fsdp_version")``)
    token: Token | None = None  # flag or environment word (``--fsdp_version``, ``FSDP_VERSION=2``)
    value_token: Token | None = None  # a flag's value given as the next word
    editable: bool = True  # False for a key of a flow mapping (``{a: 1}``) or one merged from an anchor


# What accelerate's `str_to_bool` and a bare switch (`--use_fsdp`, no value: "none") read as on.
TRUE_WORDS = frozenset({"true", "1", "yes", "y", "on", "t", "none"})


def switched_on(setting: Setting | None) -> bool:
    return setting is not None and not _is_node(setting.value) and str(setting.value).strip().lower() in TRUE_WORDS


def number(setting: Setting | None) -> int | None:
    """A setting's value as an integer (``8``, ``"8"``); None when absent, unknown or not a number."""
    if setting is None or isinstance(setting.value, bool) or _is_node(setting.value):
        return None
    text = str(setting.value).strip()
    return int(text) if text.isdigit() else None


def written(setting: Setting, *, where: bool = True) -> str:
    """The setting as its file writes it, for messages: ``--use_fsdp``, ``ACCELERATE_USE_FSDP=true``,
    ``distributed_type: FSDP``, ``fsdp_version=2``; with where it is (``launch.sh:3``) unless ``where`` is
    False."""
    if setting.token is not None:
        text = setting.token.text + (f" {setting.value_token.text}" if setting.value_token is not None else "")
    elif setting.spelling == "yaml":
        text = f"{setting.raw or setting.name}: {setting.value}"
    elif setting.spelling == "python":
        text = setting.raw + ("..." if _is_node(setting.value) else repr(setting.value))
    else:
        text = f"{setting.raw or setting.name}={setting.value}"
    return f"`{text}` at {setting.path}:{setting.line}" if where else f"`{text}`"


def _is_node(value: object) -> bool:
    """A value written in code that lintdist cannot read: the expression (a libcst node) stands for it."""
    return isinstance(value, _Unknown) or hasattr(value, "_visit_and_replace_children")


@dataclass
class LaunchSettings:
    """The settings in force for one script, later spellings overriding earlier ones (YAML < env < flag)."""

    values: dict[str, Setting] = field(default_factory=dict)
    # How the launch lines start the script (launcher, processes, nodes), where they say it; None: no line does.
    launch: Launch | None = None

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
            if switched_on(setting):
                return replace(setting, name="distributed_type", value=backend)
        return self.values.get("distributed_type")

    @property
    def backend(self) -> Setting | None:
        """The backend that runs, as ``distributed_type`` says it, unless the launch also asks for the CPU
        (``--cpu``, ``use_cpu: true``, ``ACCELERATE_USE_CPU``): then accelerate switches on neither FSDP nor
        DeepSpeed."""
        if switched_on(self.values.get("cpu")) or switched_on(self.values.get("use_cpu")):
            return None
        return self.distributed_type

    def common(self, other: LaunchSettings) -> LaunchSettings:
        """The settings both launches give the same value (a script launched in two ways)."""
        shared = {k: s for k, s in self.values.items() if k in other.values and other.values[k].value == s.value}
        if self.launch is None or other.launch is None:
            return LaunchSettings(shared, self.launch or other.launch)
        return LaunchSettings(shared, self.launch.common(other.launch))

    def fingerprint(self) -> tuple:
        values = tuple(sorted((k, repr(s.value), s.path, s.line, s.column) for k, s in self.values.items()))
        return (values, repr(self.launch)) if self.launch is not None else values


# Nested sections of an accelerate config and the prefix the launcher gives their keys (``launch.py``:
# ``defaults.fsdp_config.x`` becomes ``args.fsdp_x``); ``parallelism_config`` keys are copied as written.
SECTION_PREFIX = {"fsdp_config": "fsdp_", "fp8_config": "fp8_", "dynamo_config": "dynamo_"}
SECTIONS = (*SECTION_PREFIX, "deepspeed_config", "parallelism_config")


def section_key(section: str, key: str) -> str:
    prefix = SECTION_PREFIX.get(section, "")
    return key if key.startswith(prefix) else f"{prefix}{key}"


def config_settings(document: ConfigDocument, path: str) -> list[Setting]:
    """Settings of an accelerate config, nested keys named as the launcher names them."""
    if document.flavour != "accelerate":
        return []
    result = []
    for key, value in document.data.items():
        if key in SECTIONS and isinstance(value, dict):
            flow = bool(getattr(getattr(value, "fa", None), "flow_style", lambda: False)())
            for inner, inner_value in value.items():
                position = document.key_position(key, inner)
                line, column = position or (1, 1)
                result.append(
                    Setting(
                        section_key(key, str(inner)),
                        inner_value,
                        path,
                        line,
                        column,
                        "yaml",
                        raw=str(inner),
                        keys=(key, str(inner)),
                        editable=position is not None and not flow,
                    )
                )
        else:
            position = document.key_position(key)
            line, column = position or (1, 1)
            result.append(
                Setting(
                    str(key), value, path, line, column, "yaml", raw=str(key), keys=(str(key),), editable=bool(position)
                )
            )
    return result


def command_settings(command: LaunchCommand, launch: LaunchFile, text: str, path: str) -> list[Setting]:
    """The environment and flags of one launch line; later entries override earlier ones. The options of an
    ``srun``/``mpiexec`` that runs ``python`` itself are no launch settings (``-n`` counts its tasks: see
    ``command_launch``)."""
    result = []
    for name, value, token in [*launch.exports, *command.env]:
        prefixed = name.startswith(("FSDP_", "PARALLELISM_CONFIG_"))
        normalised = ENV_NAMES.get(name) or (name.lower() if prefixed else None)
        if normalised:
            result.append(Setting(normalised, value, path, *line_col(text, token.start), "env", raw=name, token=token))
    for flag in command.flags if command.launcher not in STARTERS else ():
        written = flag.token.text.lstrip("-").partition("=")[0]
        result.append(
            Setting(
                flag.name,
                flag.value,
                path,
                *line_col(text, flag.token.start),
                "flag",
                raw=written,
                token=flag.token,
                value_token=flag.value_token,
            )
        )
    return result


# `accelerate launch` flags that pick a backend other than FSDP (`--cpu` runs no FSDP launcher either).
OTHER_BACKEND_FLAGS = frozenset({"multi_gpu", "use_deepspeed", "use_megatron_lm", "tpu", "cpu"})


def linked_config(command: LaunchCommand, launch_path: Path) -> tuple[ConfigDocument | None, str]:
    """The accelerate config a launch line names with ``--config_file`` (parsed), and its path as written."""
    flag = next((f for f in reversed(command.flags) if f.name == "config_file" and f.value), None)
    if flag is None:
        return None, ""
    try:
        return parse_config(read_source(resolve_launch_path(flag.value, launch_path), "config").text), flag.value
    except SourceError:
        return None, flag.value


def launcher_owns_env(command: LaunchCommand | None, document: ConfigDocument | None) -> bool:
    """``accelerate launch`` running FSDP re-exports every ``FSDP_*`` variable from its own flags and
    config, so the shell's values never reach the script."""
    return command is not None and command.launcher == "accelerate" and accelerate_runs_fsdp(command, document)


def accelerate_runs_fsdp(command: LaunchCommand, document: ConfigDocument | None) -> bool | None:
    """Whether an ``accelerate launch`` line runs FSDP; None when only a default config file could tell.

    As in ``_validate_launch_command``: a backend flag decides, else the named config's ``distributed_type``.
    """
    switches = {f.name for f in command.flags if str(f.value).lower() in {"none", "true", "1"}}
    if "use_fsdp" in switches:
        return True
    if switches & OTHER_BACKEND_FLAGS:
        return False
    if document is not None and document.flavour == "accelerate":
        return str(document.data.get("distributed_type", "")).upper() == "FSDP"
    return None


def launched_version(settings: LaunchSettings | None) -> Setting | None:
    """The ``FSDP_VERSION`` a script's plugin reads from its environment, where the launch spelled it.

    ``accelerate launch`` exports it only when it runs FSDP (YAML or flag), and then
    overwrites any value exported by the shell; a shell export reaches the script
    only under other launchers.
    """
    if settings is None:
        return None
    version = settings.get("fsdp_version")
    backend = settings.distributed_type
    if version is None:
        return None
    launcher_fsdp = backend is not None and backend.spelling != "env" and str(backend.value).upper() == "FSDP"
    if version.spelling == "env":
        return None if launcher_fsdp else version
    return version if launcher_fsdp else None


def nothing_launched(settings: LaunchSettings | None) -> bool:
    """No spelling of the FSDP version anywhere: accelerate's default, 1."""
    return settings is None or settings.get("fsdp_version") is None


# -- edits in each setting's own spelling ------------------------------------------------------------


def render(value: object) -> str:
    """A value as YAML, a flag and a variable write it (``true``, ``2``, ``FULL_SHARD``)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def edit_setting(
    text: str, setting: Setting, *, remove: bool = False, value: object = None, rename: str | None = None
) -> tuple[TextEdit, ...]:
    """The edits that delete ``setting`` or give it a new value (under the normalised name ``rename``), in
    the file and spelling that said it. Empty where that cannot be done cleanly; Python keywords are edited
    as nodes (``lintdist.edits``), not here."""
    if setting.spelling == "yaml":
        return _yaml_edit(text, setting, remove, value, rename)
    if setting.spelling == "flag" and setting.token is not None:
        return _flag_edit(text, setting, remove, value, rename)
    if setting.spelling == "env" and setting.token is not None:
        if remove:
            return (remove_words(text, setting.token.start, setting.token.end),)
        name = rename.upper() if rename else setting.raw
        return (TextEdit(setting.token.start, setting.token.end, f"{name}={render(value)}"),)
    return ()


def add_setting(text: str, beside: Setting, name: str, value: object, *, before: bool = False) -> tuple[TextEdit, ...]:
    """A new setting ``name`` written right after ``beside`` (a YAML key: or right before it), in its spelling:
    a YAML key of the same mapping and indentation, a flag in the same style, a variable on the same command."""
    if beside.spelling == "yaml":
        entry = key_line(text, beside.line) if beside.editable else None
        if entry is None:
            return ()
        key = name if len(beside.keys) < 2 else _yaml_name(beside, name)
        indent = text[entry.start : entry.key[0]]
        newline = "\r\n" if text.startswith("\r", entry.end) else "\n"
        if before:
            return (TextEdit(entry.start, entry.start, f"{indent}{key}: {render(value)}{newline}"),)
        return (TextEdit(entry.end, entry.end, f"{newline}{indent}{key}: {render(value)}"),)
    if beside.spelling == "flag" and beside.token is not None:
        end = beside.value_token.end if beside.value_token is not None else beside.token.end
        return (TextEdit(end, end, f" {flag_spelling(beside.token, name)} {render(value)}"),)
    if beside.spelling == "env" and beside.token is not None:
        return (TextEdit(beside.token.end, beside.token.end, f" {name.upper()}={render(value)}"),)
    return ()


def setting_span(text: str, setting: Setting):
    """The span a finding about ``setting`` covers: the key and its value, or the flag and its value word."""
    from lintdist.model import Span

    if setting.token is not None:
        end = setting.value_token.end if setting.value_token is not None else setting.token.end
        return Span(*line_col(text, setting.token.start), *line_col(text, end))
    entry = key_line(text, setting.line) if setting.spelling == "yaml" else None
    end = entry.value[1] - entry.start + 1 if entry else setting.column + len(setting.raw or setting.name)
    return Span(setting.line, setting.column, setting.line, end)


def _yaml_name(setting: Setting, name: str) -> str:
    """A normalised name as this mapping writes its keys: ``fsdp_config`` keys with or without the prefix."""
    prefix = SECTION_PREFIX.get(setting.keys[0], "")
    return name if setting.raw.startswith(prefix) else name.removeprefix(prefix)


def _yaml_edit(text: str, setting: Setting, remove: bool, value: object, rename: str | None) -> tuple[TextEdit, ...]:
    entry = key_line(text, setting.line) if setting.editable else None
    if entry is None:
        return ()
    if remove:
        return (TextEdit(entry.start, entry.next_line, ""),)
    if rename:
        name = _yaml_name(setting, rename) if len(setting.keys) > 1 else rename
        colon = text[entry.key[1] : entry.value[0]]
        return (TextEdit(entry.key[0], entry.value[1], f"{name}{colon}{render(value)}"),)
    return (TextEdit(entry.value[0], entry.value[1], render(value)),)


def _flag_edit(text: str, setting: Setting, remove: bool, value: object, rename: str | None) -> tuple[TextEdit, ...]:
    token, value_token = setting.token, setting.value_token
    if remove:
        return (remove_words(text, token.start, value_token.end if value_token is not None else token.end),)
    name = flag_spelling(token, rename) if rename else None
    if value_token is None:  # --name=value (or a bare switch, which gets its value the same way)
        head = name or token.text.partition("=")[0]
        return (TextEdit(token.start, token.end, f"{head}={render(value)}"),)
    edits = [TextEdit(value_token.start, value_token.end, render(value))]
    if name:
        edits.append(TextEdit(token.start, token.end, name))
    return tuple(edits)


# YAML text: one ``key: value`` line.
KEY_LINE = re.compile(
    r"(?P<indent>[ \t]*)(?P<key>[^\s:#][^:#\r\n]*?)(?P<colon>[ \t]*:[ \t]*)(?P<value>[^#\r\n]*?)[ \t]*(?:#[^\r\n]*)?$"
)


@dataclass(frozen=True)
class KeyLine:
    """Offsets of one ``key: value`` line of a YAML text (the end excludes the line break)."""

    start: int
    end: int
    next_line: int
    key: tuple[int, int]
    value: tuple[int, int]


def key_line(text: str, line: int) -> KeyLine | None:
    """The ``key: scalar`` on a 1-based line, or None when it is not a simple one-line entry."""
    start = 0
    for _ in range(line - 1):
        start = text.find("\n", start) + 1
        if start == 0:
            return None
    end = text.find("\n", start)
    next_line = len(text) if end < 0 else end + 1
    end = len(text) if end < 0 else end
    if text[start:end].endswith("\r"):
        end -= 1
    match = KEY_LINE.fullmatch(text, start, end)
    if match is None or not match["value"].strip() or match["value"].strip()[0] in "{[|>&*!":
        return None
    return KeyLine(start, end, next_line, match.span("key"), match.span("value"))


# Shell text: `export ` right before a word, as its own command (the start of the line or after `;`/`&&`),
# and the list separators after which the next command starts.
LONE_EXPORT = re.compile(r"(?:^[ \t]*|[ \t]*(?:;|&&)[ \t]*)(export)[ \t]+$")
LIST_SEPARATOR = re.compile(r"(?:;|&&)[ \t]*")


def remove_words(text: str, start: int, end: int) -> TextEdit:
    """Delete the shell words in [start, end) with one neighbouring separator.

    A word alone on a continued line (``  --flag value \\``) takes its whole line, so the
    command keeps its shape; ``export NAME=1`` alone on a line goes entirely, and so does
    ``export NAME=1;`` among other commands (a bare ``export`` would print the environment).
    """
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", end)
    line_end = len(text) if line_end < 0 else line_end
    before, after = text[line_start:start], text[end:line_end].rstrip("\r")
    alone = before.strip() in {"", "export"} and after.strip() in {"", "\\"}
    if alone:
        return TextEdit(line_start, min(line_end + 1, len(text)), "")
    if (export := LONE_EXPORT.search(before)) is not None:
        rest = after.lstrip(" \t")
        if (separator := LIST_SEPARATOR.match(rest)) is not None:  # `export NAME=1; next`
            return TextEdit(line_start + export.start(1), end + len(after) - len(rest) + separator.end(), "")
        if not rest.strip("\\ \t") and export[0].lstrip(" \t")[:1] in {";", "&"}:  # `cmd; export NAME=1`
            return TextEdit(line_start + export.start(), end, "")
    trailing = len(after) - len(after.lstrip(" \t"))
    if trailing and after.strip():
        return TextEdit(start, end + trailing, "")
    leading = len(before) - len(before.rstrip(" \t"))
    return TextEdit(start - leading, end, "")


def flag_spelling(token: Token, name: str) -> str:
    """``--name`` written in the token's style (underscores or dashes)."""
    dashed = "-" in token.text.lstrip("-").partition("=")[0]
    return "--" + (name.replace("_", "-") if dashed else name)


# -- the code spelling ------------------------------------------------------------------------------


def _classes(name: str, *modules: str) -> frozenset[str]:
    return frozenset(f"{module}.{name}" for module in modules)


# Classes whose keywords are launch settings, and the table's name for each keyword: a prefix for every keyword
# (as the launcher names the same option), or a mapping of the keywords that are settings.
CODE_SPELLINGS: tuple[tuple[frozenset[str], str | dict[str, str]], ...] = (
    (
        _classes("FullyShardedDataParallelPlugin", "accelerate", "accelerate.utils", "accelerate.utils.dataclasses"),
        "fsdp_",
    ),
    (
        _classes("ParallelismConfig", "accelerate", "accelerate.utils", "accelerate.parallelism_config"),
        "parallelism_config_",
    ),
    (
        _classes("Accelerator", "accelerate", "accelerate.accelerator"),
        {
            name: name
            # not `split_batches`: 1.15 binds that keyword to a sentinel no code reads (only
            # `DataLoaderConfiguration(split_batches=...)` splits)
            for name in ("gradient_accumulation_steps", "mixed_precision", "cpu", "step_scheduler_with_optimizer")
        },
    ),
    (
        _classes("DataLoaderConfiguration", "accelerate", "accelerate.utils", "accelerate.utils.dataclasses"),
        {"split_batches": "split_batches", "dispatch_batches": "dispatch_batches", "even_batches": "even_batches"},
    ),
    (
        _classes("GradientAccumulationPlugin", "accelerate.utils", "accelerate.utils.dataclasses"),
        {"num_steps": "gradient_accumulation_steps", "sync_each_batch": "sync_each_batch"},
    ),
    (
        _classes("DeepSpeedPlugin", "accelerate", "accelerate.utils", "accelerate.utils.dataclasses"),
        {"zero_stage": "zero_stage", "gradient_accumulation_steps": "gradient_accumulation_steps"},
    ),
)
# `Accelerator` keywords that choose the backend.
BACKEND_KEYWORDS = {"fsdp_plugin": "FSDP", "deepspeed_plugin": "DEEPSPEED", "deepspeed_plugins": "DEEPSPEED"}
# Keywords that accelerate reads the launcher's environment over (``Accelerator.__init__``:
# ``parse_choice_from_env("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", gradient_accumulation_steps)``).
ENVIRONMENT_WINS = frozenset({("accelerate.Accelerator", "gradient_accumulation_steps")})


def code_settings(facts, span) -> list[Setting]:
    """The settings the code says, as plugin and ``Accelerator`` keywords, in source order.

    ``span(node)`` gives a node's position. A value lintdist can read (a literal, or a name bound to one) is
    the Python value; any other value is its expression, which ``number``/``switched_on`` read as unknown.
    """
    result = []
    for call in facts.calls:
        for classes, naming in CODE_SPELLINGS:
            if not facts.callee_is(call, classes):
                continue
            owner = next(iter(sorted(classes)))
            for arg in call.args:
                if arg.keyword is None:
                    continue
                keyword = arg.keyword.value
                if isinstance(naming, str):
                    name = keyword if keyword.startswith(naming) else f"{naming}{keyword}"
                else:
                    name = naming.get(keyword) or ""
                    if not name and keyword in BACKEND_KEYWORDS and "Accelerator" in owner:
                        result.append(_code_setting(span, arg, "distributed_type", BACKEND_KEYWORDS[keyword], owner))
                if name:
                    result.append(_code_setting(span, arg, name, _literal(facts, arg.value, call), owner))
    return result


def _code_setting(span, arg, name: str, value: object, owner: str) -> Setting:
    where = span(arg)
    return Setting(name, value, "", where.line, where.column, "python", raw=f"{arg.keyword.value}=", keys=(owner,))


def _literal(facts, expr, at) -> object:
    """The Python value of a literal (or of a name bound to one literal); the expression itself otherwise."""
    import libcst as cst

    origins = facts.origins(expr, at)
    node = origins[0].node if len(origins) == 1 and origins[0].index is None else expr
    if isinstance(node, cst.Name) and node.value in {"True", "False", "None"}:
        return {"True": True, "False": False, "None": None}[node.value]
    if isinstance(node, (cst.SimpleString, cst.ConcatenatedString, cst.Integer, cst.Float)):
        value = node.evaluated_value
        return value.decode() if isinstance(value, bytes) else value
    return node


def in_force(launch: LaunchSettings | None, code: list[Setting], path: str) -> LaunchSettings:
    """The settings a script runs with: its launch's, overridden by what its code says.

    A keyword whose value is None leaves the launch's value (accelerate then reads the launcher's
    environment); ``Accelerator(gradient_accumulation_steps=n)`` yields to the launcher's
    ``ACCELERATE_GRADIENT_ACCUMULATION_STEPS``, and a DeepSpeed launch to a code FSDP plugin. The same setting said twice in code with different
    values (two branches) is unknown: its expression stands for it.
    """
    merged = LaunchSettings(dict(launch.values) if launch is not None else {}, launch.launch if launch else None)
    said: dict[str, Setting] = {}
    for setting in code:
        setting = replace(setting, path=path)
        if setting.value is None:
            continue
        if setting.name in said and said[setting.name].value != setting.value:
            setting = replace(setting, value=_Unknown())
        said[setting.name] = setting
        before = merged.get(setting.name)
        if (setting.keys[0], setting.name) in ENVIRONMENT_WINS and before is not None and before.spelling == "env":
            continue
        if setting.name == "distributed_type" and before is not None and str(before.value).upper() == "DEEPSPEED":
            continue  # `AcceleratorState` tries DeepSpeed first: a launch's DeepSpeed wins over a code FSDP plugin
        merged.set(setting)
    return merged


# `accelerate launch` switches that choose the backend; with one of them on the line the launcher takes no
# `use_parallelism_config` from the config file (`launch_command`).
BACKEND_SWITCHES = ("multi_gpu", "tpu", "use_deepspeed", "use_fsdp", "use_megatron_lm")


def parallelism_exported(settings: LaunchSettings) -> bool:
    """Whether ``accelerate launch`` exports the ``PARALLELISM_CONFIG_*`` variables for this launch
    (``prepare_*_env``): with ``--use_parallelism_config``, or with a config that has a ``parallelism_config``
    section when no backend flag is on the line. Otherwise a ``--parallelism_config_cp_size`` flag reaches
    nothing."""
    if switched_on(settings.get("use_parallelism_config")):
        return True
    section = any(s.spelling == "yaml" and s.keys[:1] == ("parallelism_config",) for s in settings.values.values())
    flags = (settings.get(name) for name in BACKEND_SWITCHES)
    return section and not any(s is not None and s.spelling == "flag" and switched_on(s) for s in flags)


class _Unknown:
    """A value said differently in two places of the code: read as unknown, like an expression."""

    def __repr__(self) -> str:
        return "<unknown>"


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
    default_config: Path | None = None,
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
            for setting in config_settings(document, display.get(config_path) or _shown(config_path)):
                settings.set(setting)

    for launch_path, (launch, text) in sorted(launches.items()):
        # the shell text a script's options are read from, once per launch file that passes one `--deepspeed`
        shell = launch_text(text, launch_path) if "--deepspeed" in text else None
        for command in launch.commands:
            if command.script is None:
                continue
            script = resolve_launch_path(command.script.text, launch_path)
            settings = LaunchSettings()
            config_flag = next((f for f in command.flags if f.name == "config_file" and f.value), None)
            if config_flag is not None:
                add_config(settings, resolve_launch_path(config_flag.value, launch_path))
            elif default_config is not None and reads_default_config(command):
                add_config(settings, default_config)
            shown = display.get(launch_path, str(launch_path))
            for setting in command_settings(command, launch, text, shown):
                settings.set(setting)
            if shell is not None and (given := _script_deepspeed(command, text, shell, shown)) is not None:
                settings.set(given)
            if command.launcher == "python":
                # `python train.py` runs one process (unless the script spawns its own: rules check for that)
                line, column = line_col(text, command.script.start)
                settings.set(Setting("num_processes", 1, shown, line, column, "launcher"))
            settings.launch = command_launch(command, launch, settings, text, shown)
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


def _script_deepspeed(command: LaunchCommand, text: str, shell: str, shown: str) -> Setting | None:
    """The ``--deepspeed`` option a launch line passes to its script (``train.py --deepspeed ds.json``, transformers'
    ``TrainingArguments.deepspeed`` or DeepSpeed's own ``add_config_arguments``), as the setting
    ``script_deepspeed``: DeepSpeed may wrap the script's model. ``shell`` is the launch file's ``launch_text``."""
    from lintdist.script_arguments import script_flags

    flag = script_flags(command, shell).get("deepspeed")
    if flag is None:
        return None
    line, column = line_col(text, flag.token.start)
    return Setting(
        "script_deepspeed",
        flag.value,
        shown,
        line,
        column,
        "flag",
        raw="deepspeed",
        token=flag.token,
        value_token=flag.value_token,
    )


def _shown(path: Path) -> str:
    """A path for messages: relative to the working directory when under it (``configs/fsdp.yaml``), else whole
    (the default accelerate config under ``~/.cache``)."""
    relative = os.path.relpath(path)
    return str(path) if relative.startswith("..") else relative


def reads_default_config(command: LaunchCommand) -> bool:
    """``accelerate launch`` without ``--config_file`` reads the default config unless ``--cpu`` is given
    (``launch_command``: ``args.config_file is not None or os.path.isfile(default_config_file) and not args.cpu``);
    ``python``, ``torchrun`` and ``deepspeed`` lines never read it."""
    return command.launcher == "accelerate" and not any(f.name == "cpu" for f in command.flags)


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
    """A path on a launch line, read from the folder ``launch_folder`` says (an absolute one as it is)."""
    candidate = Path(name)
    return candidate if candidate.is_absolute() else launch_folder(name, launch_path) / candidate


def launch_folder(name: str, launch_path: Path) -> Path:
    """The folder a launch line's relative path is read from: the launch file's own if the path exists there; else
    the one folder above it that holds the path (``scripts/finetune_ds.sh`` saying ``torchrun finetune.py``, meant
    to be run from the repository root: see ``launch_roots``); else the cwd (``.``)."""
    if (launch_path.parent / name).exists():
        return launch_path.parent
    above = [folder for folder in launch_roots(launch_path) if (folder / name).is_file()]
    return above[0] if len(above) == 1 else Path(".")


# How far above its own folder a launch file may be meant to be run from (``examples/<task>/scripts/run.sh``).
LAUNCH_ROOT_DEPTH = 3


def launch_roots(launch_path: Path) -> list[Path]:
    """The folders above a launch file's own that it may be run from: its parents, nearest first, up to the
    repository root (the first that holds ``.git``) and at most ``LAUNCH_ROOT_DEPTH`` of them."""
    own = Path(os.path.abspath(launch_path.parent))
    if (own / ".git").exists():
        return []  # the launch file is at the repository root
    roots = []
    for folder in list(own.parents)[:LAUNCH_ROOT_DEPTH]:
        roots.append(folder)
        if (folder / ".git").exists():
            break
    return roots


# -- launched how? ---------------------------------------------------------------------------------------------

# Launchers that start copies of a command and set none of torch.distributed's variables.
STARTERS = frozenset({"mpiexec", "srun"})
# Launchers that export MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE to every process they start: torchrun's
# elastic agent (`local_elastic_agent.py::_start_workers`), `accelerate launch` (through torchrun, or
# `prepare_simple_launcher_cmd_env`), DeepSpeed's launcher (`deepspeed/launcher/launch.py`), accelerate's
# `notebook_launcher` (`elastic_launch`) and `debug_launcher` (`patch_environment`). `python`, `srun`,
# `mpiexec` and `torch.multiprocessing.spawn` set none of them: the script does.
SETS_RENDEZVOUS = frozenset({"torchrun", "accelerate", "deepspeed", "notebook_launcher", "debug_launcher"})


@dataclass(frozen=True)
class Said:
    """One fact about a launch, with where it was said: ``2`` (processes) from ``-np 2`` at ``run.sh:3``."""

    value: object
    path: str
    line: int
    words: str  # as written (``-np 2``), or the word whose default it is (``torchrun``)

    def where(self) -> str:
        return f"`{self.words}` at {self.path}:{self.line}"


@dataclass(frozen=True)
class Launch:
    """How one entry script is launched, each fact with where it was said; None where nothing says.

    ``launcher``: ``torchrun``, ``accelerate``, ``deepspeed``, ``python`` (one process), ``mpiexec``,
    ``srun``, or the script's own ``spawn`` (``torch.multiprocessing.spawn``/``start_processes``),
    ``notebook_launcher`` or ``debug_launcher``; ``under``: the ``srun``/``mpiexec`` that starts the launcher
    (``srun torchrun ...``); ``processes`` and ``nodes``: counts; ``rendezvous``: True when the launcher
    exports ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE``, False when the script must set them.
    """

    launcher: Said | None = None
    under: Said | None = None
    processes: Said | None = None
    nodes: Said | None = None
    rendezvous: Said | None = None

    @property
    def one_process(self) -> bool:
        return self.processes is not None and self.processes.value == 1

    @property
    def several_processes(self) -> bool:
        return self.processes is not None and isinstance(self.processes.value, int) and self.processes.value > 1

    @property
    def one_node(self) -> bool:
        return self.nodes is not None and self.nodes.value == 1

    def common(self, other: Launch) -> Launch:
        """What two launches of one script agree on (a README line and a Slurm script)."""

        def agreed(mine: Said | None, theirs: Said | None) -> Said | None:
            return mine if mine is not None and theirs is not None and mine.value == theirs.value else None

        return Launch(
            agreed(self.launcher, other.launcher),
            agreed(self.under, other.under),
            agreed(self.processes, other.processes),
            agreed(self.nodes, other.nodes),
            agreed(self.rendezvous, other.rendezvous),
        )


def _count(value: object, separator: str = "") -> int | None:
    """A count as a launcher writes it: ``8``; a range (srun's ``2-2``, torchrun's ``1:1``) only when both ends
    agree; None for anything else (``$SLURM_NNODES``, ``auto``, ``1:4``)."""
    text = str(value).strip() if value is not None else ""
    if separator and separator in text:
        low, _, high = text.partition(separator)
        return int(low) if low.isdigit() and low == high else None
    return int(text) if text.isdigit() else None


def command_launch(
    command: LaunchCommand, launch: LaunchFile, settings: LaunchSettings, text: str, path: str
) -> Launch:
    """What one launch line says of how its script runs: the launcher, the ``srun``/``mpiexec`` around it, and
    the counts its words (or the launcher's defaults) give. ``settings`` are the line's (config included)."""

    def said(value: object, token: Token, words: str | None = None) -> Said:
        return Said(value, path, line_col(text, token.start)[0], words or token.text)

    def flag_said(flag, value: object) -> Said:
        words = flag.token.text + (f" {flag.value_token.text}" if flag.value_token is not None else "")
        return said(value, flag.token, words)

    def flag(cmd: LaunchCommand, *names: str):
        return next((f for f in reversed(cmd.flags) if f.name in names), None)

    def env(name: str) -> tuple[str, Token] | None:
        found = [(value, token) for n, value, token in [*launch.exports, *command.env] if n == name]
        return found[-1] if found else None

    starter = command.wrapper if command.wrapper is not None else command if command.launcher in STARTERS else None
    started_processes, started_nodes = _starter_counts(starter, flag, flag_said) if starter else (None, None)
    kind = command.launcher
    launcher = said(kind, command.token) if command.token is not None else None
    under = said(command.wrapper.launcher, command.wrapper.token) if command.wrapper is not None else None
    rendezvous = said(kind in SETS_RENDEZVOUS, command.token) if command.token is not None else None
    processes = nodes = None
    if kind == "python":
        processes = nodes = said(1, command.token)
    elif kind in STARTERS:
        processes, nodes = started_processes, started_nodes
    elif kind == "torchrun":
        nodes, per_node = _torchrun_counts(command, flag, flag_said, env, said, started_nodes)
        processes = _product(per_node, nodes, path)
    elif kind == "accelerate":
        total, machines = number(settings.get("num_processes")), number(settings.get("num_machines"))
        if total is not None:
            processes = _setting_said(settings.get("num_processes"), total)
        if machines is not None:
            nodes = _setting_said(settings.get("num_machines"), machines)
        elif total == 1:
            nodes = processes
        else:
            nodes = started_nodes
    elif kind == "deepspeed":
        gpus, count = flag(command, "num_gpus"), flag(command, "num_nodes")
        nodes = flag_said(count, _count(count.value)) if count is not None and _count(count.value) else started_nodes
        per_node = flag_said(gpus, _count(gpus.value)) if gpus is not None and _count(gpus.value) else None
        processes = _product(per_node, nodes, path)
    return Launch(launcher, under, processes, nodes, rendezvous)


def _setting_said(setting: Setting, value: int) -> Said:
    return Said(value, setting.path, setting.line, written(setting, where=False).strip("`"))


def _product(per_node: Said | None, nodes: Said | None, path: str) -> Said | None:
    """Processes per node times nodes, said where the per-node count is."""
    if per_node is None or nodes is None:
        return None
    if nodes.value == 1:
        return per_node
    return Said(per_node.value * nodes.value, per_node.path, per_node.line, f"{per_node.words} on {nodes.words}")


def _torchrun_counts(command, flag, flag_said, env, said, started_nodes):
    """torchrun's nodes and processes per node: its flags, else the ``PET_*`` variables it reads as defaults,
    else its defaults (``--nnodes 1:1``, ``--nproc-per-node 1``), except that under ``srun``/``mpiexec`` the
    nodes are the starter's."""
    nodes = None
    nnodes = flag(command, "nnodes")
    if flag(command, "standalone") is not None:
        nodes = flag_said(flag(command, "standalone"), 1)
    elif nnodes is not None:
        nodes = flag_said(nnodes, _count(nnodes.value, ":")) if _count(nnodes.value, ":") else None
    elif (variable := env("PET_NNODES")) is not None:
        value, token = variable
        nodes = said(_count(value, ":"), token) if _count(value, ":") else None
    elif command.wrapper is not None:
        nodes = started_nodes
    else:
        nodes = said(1, command.token)
    per_node = None
    nproc = flag(command, "nproc_per_node")
    if nproc is not None:
        per_node = flag_said(nproc, _count(nproc.value)) if _count(nproc.value) else None
    elif (variable := env("PET_NPROC_PER_NODE")) is not None:
        value, token = variable
        per_node = said(_count(value), token) if _count(value) else None
    else:
        per_node = said(1, command.token)
    if nnodes is not None and nodes is None and started_nodes is not None:
        nodes = started_nodes  # `--nnodes $SLURM_NNODES` under `srun -N 2`
    return nodes, per_node


def _starter_counts(starter: LaunchCommand, flag, flag_said) -> tuple[Said | None, Said | None]:
    """The tasks and nodes an ``srun`` or ``mpiexec`` line asks for: srun's ``-n``/``--ntasks``, ``-N``/``--nodes``
    and ``--ntasks-per-node``; mpiexec's ``-n``/``-np``. One task runs on one node; otherwise nodes are known only
    where srun names them (mpiexec places its ranks by hostfile or allocation, which the line does not show)."""
    if starter.launcher == "srun":
        tasks, count = flag(starter, "n", "ntasks"), flag(starter, "N", "nodes")
        per_node = flag(starter, "ntasks_per_node")
    else:
        tasks, count, per_node = flag(starter, "n", "np"), None, None
    nodes = flag_said(count, _count(count.value, "-")) if count is not None and _count(count.value, "-") else None
    processes = flag_said(tasks, _count(tasks.value)) if tasks is not None and _count(tasks.value) else None
    if processes is None and per_node is not None and _count(per_node.value) and nodes is not None:
        processes = _product(flag_said(per_node, _count(per_node.value)), nodes, nodes.path)
    if nodes is None and processes is not None and processes.value == 1:
        nodes = processes
    return processes, nodes


# Calls that start the script's processes from inside it: (the launcher's name, the keyword and position of its
# process count, its default), and where accelerate's `notebook_launcher` takes its node count.
SPAWN_CALLS = {
    "torch.multiprocessing.spawn": ("spawn", "nprocs", 2, 1),
    "torch.multiprocessing.spawn.spawn": ("spawn", "nprocs", 2, 1),
    "torch.multiprocessing.start_processes": ("spawn", "nprocs", 2, 1),
    "torch.multiprocessing.spawn.start_processes": ("spawn", "nprocs", 2, 1),
    "accelerate.notebook_launcher": ("notebook_launcher", "num_processes", 2, None),
    "accelerate.launchers.notebook_launcher": ("notebook_launcher", "num_processes", 2, None),
    "accelerate.debug_launcher": ("debug_launcher", "num_processes", 2, 2),
    "accelerate.launchers.debug_launcher": ("debug_launcher", "num_processes", 2, 2),
}
SPAWN_NAMES = frozenset(SPAWN_CALLS)
# the last parts of those names: an alias is imported under one of them, so a text without any starts nothing
SPAWN_WORDS = frozenset(name.rsplit(".", 1)[-1] for name in SPAWN_CALLS)
NOTEBOOK_NODES = ("num_nodes", 7)


def spawned(facts, span, path: str) -> Launch | None:
    """The launch the script makes itself (``mp.spawn(fn, nprocs=4)``, ``notebook_launcher(fn, num_processes=2)``):
    the processes it starts, on this machine; None when it starts none. Two such calls that disagree leave the
    count unknown."""
    import libcst as cst
    from libcst.helpers import get_full_name_for_node

    from lintdist.facts import argument_of

    found: list[Launch] = []
    for call in facts.calls:
        if not facts.callee_is(call, SPAWN_NAMES):
            continue
        name = next(n for n in sorted(facts.qualified_names(call.func)) if n in SPAWN_CALLS)
        kind, keyword, position, default = SPAWN_CALLS[name]
        line = span(call).line
        shown = f"{get_full_name_for_node(call.func) or kind}(...)"

        def said(value: object, words: str = shown) -> Said:
            return Said(value, path, line, words)

        def counted(keyword: str, position: int, default: int | None) -> Said | None:
            value = argument_of(call, keyword, position)
            if value is None:
                return said(default) if default is not None else None
            literal = _literal(facts, value, call)
            written = cst.Module([]).code_for_node(value)
            return said(literal, f"{keyword}={written}") if type(literal) is int else None

        processes = counted(keyword, position, default)
        nodes = counted(*NOTEBOOK_NODES, 1) if kind == "notebook_launcher" else said(1)
        if processes is not None and nodes is not None and nodes.value != 1:
            processes = _product(processes, nodes, path)
        found.append(Launch(said(kind), None, processes, nodes, said(kind in SETS_RENDEZVOUS)))
    if not found:
        return None
    first = found[0]
    for other in found[1:]:
        first = first.common(other)
    return first


def script_launch(context) -> Launch:
    """*Launched how?* for one checked file: the processes its own code starts (``mp.spawn``), else what the
    launch lines that name it say, else nothing known. Asked once per file."""
    facts = context.facts
    linked = context.settings.launch if context.settings is not None else None
    if facts is None:
        return linked or Launch()
    if "launch" not in facts._memo:
        # a file whose text names no spawning function starts no processes: its calls need not be resolved
        spawns = any(word in context.text for word in SPAWN_WORDS)
        facts._memo["launch"] = (spawns and spawned(facts, context.span, context.display_name)) or linked or Launch()
    return facts._memo["launch"]


def top_key_setting(document: ConfigDocument, key: str, path: str) -> Setting | None:
    """A top-level key of an accelerate config as a setting (a section such as ``fsdp_config`` too), for the span
    of a finding about it or an edit beside it; None when the file does not write the key."""
    position = document.key_position(key)
    if position is None:
        return None
    return Setting(key, document.data.get(key), path, *position, "yaml", raw=key, keys=(key,))


def setting_place(setting: Setting) -> str:
    """Where a setting is said, for messages: its file's name and line (``config.yaml:3``)."""
    return f"{os.path.basename(setting.path)}:{setting.line}"


# Classes whose objects are processes a script starts itself, one at a time.
PROCESS_CLASSES = frozenset({"torch.multiprocessing.Process", "multiprocessing.Process"})
STARTER_NAMES = SPAWN_NAMES | PROCESS_CLASSES
STARTER_WORDS = SPAWN_WORDS | {"Process"}


def starts_processes(facts) -> bool:
    """The script starts its processes itself: ``mp.spawn``/``start_processes``, accelerate's
    ``notebook_launcher``/``debug_launcher``, or a ``multiprocessing.Process``."""
    return any(
        facts.method_name(call) in STARTER_WORDS and facts.callee_is(call, STARTER_NAMES) for call in facts.calls
    )


# The flag that counts a launcher's nodes.
NODE_FLAGS = {"torchrun": ("nnodes",), "accelerate": ("num_machines",), "deepspeed": ("num_nodes",)}


def most_nodes(command: LaunchCommand, launch: LaunchFile, text: str, path: str) -> tuple[int | None, str]:
    """The most nodes a launch line may start, with the words that say so: its node flag (``--nnodes 2``;
    torchrun's elastic ``1:4`` counts 4), else, under ``srun``/``mpiexec``, the nodes the starter asks for; (None,
    "") when nothing says (``--nnodes $NNODES`` alone)."""
    flags = {f.name: f for f in command.flags}
    flag = next((flags[n] for n in NODE_FLAGS.get(command.launcher, ()) if n in flags), None)
    last = flag.value.rsplit(":", 1)[-1] if flag is not None and flag.value is not None else ""
    if last.isdigit():
        return int(last), f"--{flag.name} {flag.value}"
    if command.wrapper is None:
        return None, ""
    settings = LaunchSettings()
    for setting in command_settings(command, launch, text, path):
        settings.set(setting)
    started = command_launch(command, launch, settings, text, path).nodes
    return (started.value, started.words) if started is not None else (None, "")


def config_beside(script: Path) -> tuple[Path, ConfigDocument] | None:
    """The one accelerate config in a script's folder (the file ``accelerate launch --config_file`` would be pointed
    at), parsed; None when the folder holds none, or several."""
    found = []
    for path in sorted(script.parent.glob("*.y*ml")):
        try:
            document = parse_config(read_source(path, "config").text)
        except SourceError:
            continue
        if document is not None and document.flavour == "accelerate":
            found.append((path, document))
    return found[0] if len(found) == 1 else None


# Launch files a project keeps beside its scripts (what `lintdist.discover` classifies as launch files or pages).
LAUNCH_FILE_PATTERNS = ("*.sh", "*.bash", "*.md", "*.mdx", "*.rst")


def launchers_of(script: Path, folders: list[Path]) -> set[str]:
    """The launchers (``python``, ``accelerate``, ``torchrun``...) the launch files and pages of ``folders`` start
    ``script`` with, read from their text; empty when none names it."""
    found = set()
    seen: set[Path] = set()
    target = os.path.realpath(script)
    for folder in folders:
        for pattern in LAUNCH_FILE_PATTERNS:
            for path in folder.glob(pattern):
                if path in seen or not path.is_file():
                    continue
                seen.add(path)
                try:
                    text = read_source(path, "launch").text
                except SourceError:
                    continue
                if script.name not in text:
                    continue
                for command in parse_launch(launch_text(text, path)).commands:
                    named = command.script is not None and os.path.realpath(
                        resolve_launch_path(command.script.text, path)
                    )
                    if named == target:
                        found.add(command.launcher)
    return found
