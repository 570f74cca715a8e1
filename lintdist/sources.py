"""Reading files into text, and parsing accelerate/DeepSpeed configs and launch commands.

Text is decoded without newline translation so that line endings, the BOM and
the encoding can be written back exactly as they were.
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class SourceError(Exception):
    """A file that cannot be read or parsed; reported as a finding, never raised to the user."""

    def __init__(self, code: str, message: str, line: int = 1, column: int = 1) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.line = line
        self.column = column


@dataclass(frozen=True)
class SourceText:
    text: str
    encoding: str  # "utf-8-sig" when the file starts with a BOM


def read_source(path: Path, kind: str) -> SourceText:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise SourceError("LD002", f"cannot read file: {error.strerror or error}") from error
    return decode_source(data, kind)


def decode_source(data: bytes, kind: str) -> SourceText:
    """A file's bytes as text, by its coding cookie or BOM; a clear error where that fails."""
    if b"\0" in data[:8192]:
        raise SourceError("LD001", "binary file (contains NUL bytes), not a text source")
    encoding = "utf-8"
    if kind == "python":
        try:
            encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        except SyntaxError as error:
            raise SourceError("LD001", f"bad coding cookie: {error}") from error
    elif data.startswith(b"\xef\xbb\xbf"):
        encoding = "utf-8-sig"
    try:
        text = data.decode(encoding)
    except (UnicodeDecodeError, LookupError) as error:
        detail = f"at byte {error.start}" if isinstance(error, UnicodeDecodeError) else str(error)
        raise SourceError(
            "LD001",
            f"cannot decode as {encoding} ({detail}); add a coding cookie or re-save the file as UTF-8",
            line=data[: getattr(error, "start", 0)].count(b"\n") + 1,
        ) from error
    return SourceText(text, encoding)


def line_col(text: str, offset: int) -> tuple[int, int]:
    """1-based line and column of a character offset."""
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


# -- accelerate and DeepSpeed configuration files --------------------------------------

ACCELERATE_KEYS = ("distributed_type", "compute_environment", "fsdp_config", "deepspeed_config")
DEEPSPEED_KEYS = ("zero_optimization", "train_micro_batch_size_per_gpu")
CONFIG_MARKERS = re.compile("|".join(ACCELERATE_KEYS + DEEPSPEED_KEYS))


@dataclass
class ConfigDocument:
    """A parsed accelerate or DeepSpeed config; ``data`` keeps ruamel's line and column information."""

    data: Any
    flavour: str  # "accelerate" or "deepspeed"

    def key_position(self, *keys: str) -> tuple[int, int] | None:
        """1-based line and column of a (nested) key; None for a key that is absent or merged in (``<<: *base``)."""
        node = self.data
        position = None
        for key in keys:
            if not hasattr(node, "lc") or key not in node:
                return None
            try:
                line, column = node.lc.key(key)
            except KeyError:  # merged from an anchor: not written in this mapping
                return None
            position = (line + 1, column + 1)
            node = node[key]
        return position


def parse_config(text: str) -> ConfigDocument | None:
    """The config, or None when the document carries no accelerate or DeepSpeed keys."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import MarkedYAMLError, YAMLError

    yaml = YAML(typ="rt")
    try:
        data = yaml.load(text)
    except MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        raise SourceError("LD001", f"invalid YAML: {error.problem or error}", line, column) from error
    except YAMLError as error:
        raise SourceError("LD001", f"invalid YAML: {error}") from error
    if not isinstance(data, dict):
        return None
    if any(key in data for key in ACCELERATE_KEYS):
        return ConfigDocument(data, "accelerate")
    if any(key in data for key in DEEPSPEED_KEYS):
        return ConfigDocument(data, "deepspeed")
    return None


# -- launch commands in shell files -----------------------------------------------------

LAUNCHERS = re.compile(
    r"accelerate\s+launch|accelerate\.commands\.launch|torchrun|torch\.distributed\.(?:run|launch)|(?<![\w.])deepspeed\s"
    r"|(?<![\w.-])(?:mpiexec|mpirun|srun)\s"
)
# Commands that start copies of the command after them (``srun -N 2 torchrun ...``, ``mpirun -np 4 python t.py``),
# by the name the launch table gives them.
PROCESS_STARTERS = {"mpiexec": "mpiexec", "mpirun": "mpiexec", "srun": "srun"}
# A short option with its count attached (``-n4``, ``-N2``), as srun's and mpiexec's option parsers accept it.
ATTACHED_COUNT = re.compile(r"^-([nNc])(\d+)$")
# A plain `python train.py` line: not a launcher, but it says how a script runs (one process).
PYTHON_RUN = re.compile(r"\bpython[\d.]*\s+(?:-\S+\s+)*\S+\.py\b")
# `python -m <module>` spellings of the launchers.
PYTHON_LAUNCHERS = {
    "torch.distributed.run": "torchrun",
    "torch.distributed.launch": "torchrun",
    "accelerate.commands.launch": "accelerate",
}
ACCELERATE_BOOLEAN_FLAGS = frozenset(
    [
        "cpu",
        "debug",
        "downcast_bf16",
        "dynamo_use_dynamic",
        "dynamo_use_fullgraph",
        "dynamo_use_regional_compilation",
        "enable_cpu_affinity",
        "fp8_use_autocast_during_eval",
        "module",
        "m",
        "no_python",
        "multi_gpu",
        "quiet",
        "q",
        "same_network",
        "tpu",
        "tpu_cluster",
        "tpu_use_sudo",
        "use_deepspeed",
        "use_fsdp",
        "use_megatron_lm",
        "use_parallelism_config",
        "standalone",
        "run_path",
    ]
)


@dataclass(frozen=True)
class Token:
    text: str
    start: int
    end: int


@dataclass(frozen=True)
class Flag:
    name: str  # without dashes, dashes inside turned to underscores
    value: str | None
    token: Token
    value_token: Token | None = None  # the separate word holding the value, if any


@dataclass
class LaunchCommand:
    # "accelerate", "torchrun", "deepspeed", "python" (one process), or "mpiexec"/"srun" starting `python` itself
    launcher: str
    env: list[tuple[str, str, Token]] = field(default_factory=list)
    flags: list[Flag] = field(default_factory=list)
    script: Token | None = None
    token: Token | None = None  # the launcher's first word (``torchrun``, ``accelerate``, ``mpirun``...)
    # The ``srun``/``mpiexec`` command that starts this launcher (``srun -N 2 torchrun ...``): its flags, not
    # the launcher's. None when the launcher is run directly, or is itself the ``srun``/``mpiexec``.
    wrapper: LaunchCommand | None = None


@dataclass
class LaunchFile:
    exports: list[tuple[str, str, Token]]
    commands: list[LaunchCommand]


def shell_tokens(text: str) -> list[list[Token]]:
    """Split shell text into commands of words, keeping each word's offsets.

    Handles quotes, backslash escapes, line continuations, comments and the
    separators ``;``, ``&&``, ``||``, ``|`` and newlines. Enough for launch
    lines; not a shell.
    """
    commands: list[list[Token]] = [[]]
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\" and text.startswith("\n", i + 1):
            i += 2
        elif ch == "\\" and text.startswith("\r\n", i + 1):
            i += 3
        elif ch in " \t\r":
            i += 1
        elif ch == "#":
            while i < n and text[i] != "\n":
                i += 1
        elif ch in "\n;&|()":
            commands.append([])
            i += 1
        else:
            start, word = i, []
            while i < n and text[i] not in " \t\r\n;&|()":
                c = text[i]
                if c == "\\" and i + 1 < n:
                    if text[i + 1] != "\n":
                        word.append(text[i + 1])
                    i += 2
                elif c in "'\"":
                    close = text.find(c, i + 1)
                    close = n if close < 0 else close
                    word.append(text[i + 1 : close])
                    i = close + 1
                else:
                    word.append(c)
                    i += 1
            commands[-1].append(Token("".join(word), start, i))
    return [c for c in commands if c]


ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)


# A fenced code block's opening line in Markdown, and the info strings that mark a shell block (or none).
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})[ \t]*([^`\s]*)[^`\n]*$")
SHELL_BLOCKS = frozenset({"", "bash", "sh", "shell", "console", "zsh", "shell-session", "shellsession"})
PROMPT = re.compile(r"^([ \t]*)(?:\(\S+\)[ \t]*)?\$[ \t]")


def launch_text(text: str, path: Path) -> str:
    """The shell text of a launch file. For reStructuredText, the shell blocks of its code directives, in place.
    For Markdown (``*.md``, ``*.mdx``): only its fenced shell blocks (``bash``, ``sh``,
    ``shell``, ``console`` or no language), with ``$ `` prompts blanked and everything else turned into spaces,
    so that every offset, line and column is the Markdown file's own. In a ``console`` block, lines that
    follow no prompt are output and are blanked too."""
    suffix = path.suffix.lower()
    if suffix == ".rst":
        from lintdist.pages import read_page

        page = read_page(text, suffix)
        return page.in_place([block for block in page.blocks if block.language == "shell"])
    if suffix not in {".md", ".mdx"}:
        return text
    out: list[str] = []
    fence: str | None = None
    console = continued = False
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        ending = line[len(body) :]
        if fence is None:
            opening = FENCE.match(body)
            if opening and opening[2].lower() in SHELL_BLOCKS:
                fence, console, continued = opening[1], opening[2].lower() == "console", False
            elif opening:
                fence = "skip:" + opening[1]
            out.append(" " * len(body) + ending)
            continue
        marker = fence.removeprefix("skip:")
        if body.strip().startswith(marker[0] * len(marker)) and not body.strip().strip(marker[0]):
            fence = None
            out.append(" " * len(body) + ending)
            continue
        if fence.startswith("skip:"):
            out.append(" " * len(body) + ending)
            continue
        prompt = PROMPT.match(body)
        if prompt:
            body = " " * prompt.end() + body[prompt.end() :]
        elif console and not continued:
            body = " " * len(body)
        continued = body.rstrip().endswith("\\") and (prompt is not None or continued or not console)
        out.append(body + ending)
    return "".join(out)


def parse_launch(text: str) -> LaunchFile:
    exports: list[tuple[str, str, Token]] = []
    commands: list[LaunchCommand] = []
    # `NAME=value` alone on a line sets a shell variable that child processes do not see until `export NAME`.
    unexported: dict[str, tuple[str, str, Token]] = {}
    for words in shell_tokens(text):
        if words[0].text == "export":
            for word in words[1:]:
                if m := ASSIGNMENT.match(word.text):
                    exports.append((m[1], m[2], word))
                elif word.text in unexported:
                    exports.append(unexported.pop(word.text))
            continue
        env = []
        while words and (m := ASSIGNMENT.match(words[0].text)):
            env.append((m[1], m[2], words[0]))
            words = words[1:]
        command = _launch_command(words)
        if command is not None:
            command.env = env
            commands.append(command)
        elif not words:
            unexported.update((name, (name, value, token)) for name, value, token in env)
    return LaunchFile(exports, commands)


def _python_target(texts: list[str]) -> tuple[str | None, int] | None:
    """What ``python [-u -W x ...]`` runs: (module, index after it) for ``-m module``, (None, index of the
    script) for ``train.py``; None for ``-c`` and anything that is not a Python command."""
    if not texts or not Path(texts[0]).name.startswith("python"):
        return None
    i = 1
    while i < len(texts) and texts[i].startswith("-") and texts[i] not in {"-m", "-c"}:
        i += 2 if texts[i] in {"-W", "-X"} else 1
    if i + 1 < len(texts) and texts[i] == "-m":
        return texts[i + 1], i + 2
    if i < len(texts) and texts[i].endswith(".py"):
        return None, i
    return None


def _launch_command(words: list[Token]) -> LaunchCommand | None:
    texts = [w.text for w in words]
    if texts and Path(texts[0]).name in PROCESS_STARTERS:
        return _started_command(words)
    if texts[:2] == ["accelerate", "launch"]:
        launcher, rest = "accelerate", words[2:]
    elif texts[:1] == ["torchrun"]:
        launcher, rest = "torchrun", words[1:]
    elif (target := _python_target(texts)) is not None and target[0] in {None, *PYTHON_LAUNCHERS}:
        module, start = target
        launcher, rest = PYTHON_LAUNCHERS.get(module, "python"), words[start:]
    elif texts[:1] == ["deepspeed"]:
        launcher, rest = "deepspeed", words[1:]
    else:
        return None
    command = LaunchCommand(launcher, token=words[0])
    i = 0
    while i < len(rest):
        word = rest[i]
        if not word.text.startswith("-"):
            command.script = word
            break
        name, _, value = word.text.lstrip("-").partition("=")
        name = name.replace("-", "_")
        if value or "=" in word.text:
            command.flags.append(Flag(name, value, word))
        elif name not in ACCELERATE_BOOLEAN_FLAGS and i + 1 < len(rest) and not rest[i + 1].text.startswith("-"):
            command.flags.append(Flag(name, rest[i + 1].text, word, rest[i + 1]))
            i += 1
        else:
            command.flags.append(Flag(name, None, word))
        i += 1
    return command


def _started_command(words: list[Token]) -> LaunchCommand | None:
    """``srun``/``mpiexec``/``mpirun`` with its options, then the command it starts: another launcher
    (``srun torchrun ...`` is torchrun, with the srun command as its ``wrapper``), ``python train.py`` or a
    ``train.py`` run directly (the srun/mpiexec command is then the launcher). None when it starts anything
    else (``srun hostname``, ``mpirun bash -c "..."``)."""
    starter = PROCESS_STARTERS[Path(words[0].text).name]
    for i in range(1, len(words)):
        if words[i].text.startswith("-"):
            continue
        inner = _launch_command(words[i:]) if Path(words[i].text).name not in PROCESS_STARTERS else None
        before = words[i - 1].text
        value = before.startswith("-") and "=" not in before and not ATTACHED_COUNT.match(before)  # `-o log.py`
        direct = inner is None and not value and words[i].text.endswith(".py")
        if inner is None and not direct:
            continue
        outer = LaunchCommand(starter, flags=_starter_flags(words[1:i]), token=words[0])
        if direct:
            outer.script = words[i]
            return outer
        if inner.launcher == "python":
            outer.script = inner.script
            return outer
        inner.wrapper = outer
        return inner
    return None


def _starter_flags(words: list[Token]) -> list[Flag]:
    """The options of ``srun``/``mpiexec`` before the command they start. Names keep their case (srun's ``-n``
    counts tasks, ``-N`` nodes); a value is the option's ``=value``, its attached count (``-n4``) or the next
    word that is not an option."""
    flags: list[Flag] = []
    i = 0
    while i < len(words):
        word = words[i]
        if not word.text.startswith("-"):
            i += 1
            continue
        if attached := ATTACHED_COUNT.match(word.text):
            flags.append(Flag(attached[1], attached[2], word))
        elif "=" in word.text:
            name, _, value = word.text.lstrip("-").partition("=")
            flags.append(Flag(name.replace("-", "_"), value, word))
        elif i + 1 < len(words) and not words[i + 1].text.startswith("-"):
            flags.append(Flag(word.text.lstrip("-").replace("-", "_"), words[i + 1].text, word, words[i + 1]))
            i += 1
        else:
            flags.append(Flag(word.text.lstrip("-").replace("-", "_"), None, word))
        i += 1
    return flags
