"""Settings from ``[tool.lintdist]`` (pyproject.toml) or lintdist.toml, merged with the command line."""

from __future__ import annotations

import fnmatch
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from lintdist.registry import RuleInfo, manifest

KNOWN_KEYS = frozenset(
    {
        "select",
        "ignore",
        "extend-select",
        "exclude",
        "extend-exclude",
        "per-file-ignores",
        "unsafe-fixes",
        "accelerate-config",
        "target-versions",  # read by lintdist.versions, beside the project's manifests
        "docs",
        "docstrings",
    }
)
CACHE_FOLDER = ".lintdist_cache"
DEFAULT_EXCLUDE = (
    ".bzr",
    ".direnv",
    ".eggs",
    ".git",
    ".hg",
    ".mypy_cache",
    ".nox",
    ".pytest_cache",
    ".ruff_cache",
    ".svn",
    ".tox",
    ".venv",
    ".lintdist_cache",
    "__pycache__",
    "__pypackages__",
    "_build",
    "buck-out",
    "build",
    "dist",
    "node_modules",
    "site-packages",
    "venv",
)


class ConfigError(Exception):
    """A configuration or usage mistake: reported in one line, exit code 2."""


@dataclass(frozen=True)
class Settings:
    root: Path
    source: Path | None
    select: tuple[str, ...] | None = None
    ignore: tuple[str, ...] = ()
    extend_select: tuple[str, ...] = ()
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE
    extend_exclude: tuple[str, ...] = ()
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    unsafe_fixes: bool = False
    accelerate_config: tuple[Path, ...] = ()
    # the config `accelerate launch` reads when a line names none; None under `--isolated` or where absent
    default_accelerate_config: Path | None = None
    enabled: frozenset[str] = field(default=frozenset())
    known: frozenset[str] | None = None  # every rule code (None: ask the registry)
    docs: bool = True  # the code blocks of Markdown, MDX and reStructuredText pages
    docstrings: bool = False  # the examples in Python docstrings (libraries' docstrings are not training scripts)

    def enabled_for(self, relative: str) -> frozenset[str]:
        """Codes enabled for one file, after ``per-file-ignores``."""
        ignored = {
            code
            for pattern, codes in self.per_file_ignores
            if _glob_match(relative, pattern)
            for code in _expand(codes, "per-file-ignores", self.known)
        }
        return self.enabled - ignored

    def fingerprint(self) -> tuple:
        default = self.default_accelerate_config
        try:
            stamp = (str(default), default.stat().st_mtime_ns, default.stat().st_size) if default else None
        except OSError:
            stamp = None
        return (
            sorted(self.enabled),
            self.per_file_ignores,
            self.unsafe_fixes,
            tuple(map(str, self.accelerate_config)),
            stamp,
            self.docs,
            self.docstrings,
        )


def default_accelerate_config() -> Path | None:
    """The file ``accelerate launch`` reads when no ``--config_file`` is given (accelerate 1.15,
    ``commands/config/config_args.py``): ``default_config.yaml`` under ``$HF_HOME/accelerate``, else
    ``$XDG_CACHE_HOME/huggingface/accelerate``, else ``~/.cache/huggingface/accelerate``; None when absent."""
    home = os.environ.get("HF_HOME", os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"))
    path = Path(os.path.expanduser(home)) / "accelerate" / "default_config.yaml"
    return path if path.is_file() else None


def _glob_match(relative: str, pattern: str) -> bool:
    return fnmatch.fnmatch(relative, pattern) or fnmatch.fnmatch(Path(relative).name, pattern)


def _expand(selectors: tuple[str, ...] | list[str], where: str, codes: set[str] | None = None) -> set[str]:
    """Codes matched by codes or prefixes (``LD2``, ``LD201``, ``ALL``); unknown selectors are errors."""
    codes = codes if codes is not None else {rule.code for rule in manifest()}
    result: set[str] = set()
    for selector in selectors:
        selector = selector.strip().upper()
        matched = codes if selector == "ALL" else {c for c in codes if c.startswith(selector)}
        if not selector or not matched:
            raise ConfigError(f"{where}: unknown rule code or prefix {selector!r} (see `lintdist rules`)")
        result |= matched
    return result


def find_config_file(start: Path) -> Path | None:
    """The nearest lintdist.toml, or pyproject.toml with a [tool.lintdist] table, from ``start`` upward."""
    start = start.resolve()
    for folder in [start, *start.parents] if start.is_dir() else list(start.parents):
        candidate = folder / "lintdist.toml"
        if candidate.is_file():
            return candidate
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            try:
                if "lintdist" in _read_toml(candidate).get("tool", {}):
                    return candidate
            except ConfigError:
                continue
    return None


def _read_toml(path: Path) -> dict:
    if sys.version_info >= (3, 11):  # imported here: a check with no configuration file does not load it
        import tomllib
    else:  # pragma: no cover - exercised on Python 3.10 only
        import tomli as tomllib
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"{path}: cannot read configuration: {error}") from error


def load_table(path: Path) -> dict:
    data = _read_toml(path)
    table = data.get("tool", {}).get("lintdist", {}) if path.name == "pyproject.toml" else data
    unknown = sorted(set(table) - KNOWN_KEYS)
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(unknown)}; known keys: {', '.join(sorted(KNOWN_KEYS))}")
    return table


def _strings(table: dict, key: str, path: Path | None) -> tuple[str, ...] | None:
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{path}: `{key}` must be a list of strings")
    return tuple(value)


def resolve_settings(
    config_file: Path | None,
    start: Path,
    *,
    select: tuple[str, ...] | None = None,
    ignore: tuple[str, ...] = (),
    extend_select: tuple[str, ...] = (),
    unsafe_fixes: bool | None = None,
    isolated: bool = False,
    docs: bool | None = None,
    docstrings: bool | None = None,
) -> Settings:
    """Settings from the config file (given or found upward from ``start``), the command line winning. The
    rules' codes come from their manifest: no rule module is imported here."""
    path = config_file or find_config_file(start)
    if config_file is not None and not config_file.is_file():
        raise ConfigError(f"--config: no such file: {config_file}")
    table = load_table(path) if path else {}
    root = path.parent.resolve() if path else Path.cwd().resolve()

    file_select = _strings(table, "select", path)
    chosen_select = select if select is not None else file_select
    chosen_ignore = (_strings(table, "ignore", path) or ()) + tuple(ignore)
    chosen_extend = (_strings(table, "extend-select", path) or ()) + tuple(extend_select)

    per_file = table.get("per-file-ignores", {})
    if not isinstance(per_file, dict):
        raise ConfigError(f"{path}: `per-file-ignores` must be a table of glob = [codes]")
    per_file_ignores = tuple((glob, _strings(per_file, glob, path) or ()) for glob in sorted(per_file))
    rules: tuple[RuleInfo, ...] = manifest()
    codes = {rule.code for rule in rules}
    for _, selected in per_file_ignores:
        _expand(selected, "per-file-ignores", codes)

    switches = {
        key: table.get(key, default)
        for key, default in (("unsafe-fixes", False), ("docs", True), ("docstrings", False))
    }
    for key, value in switches.items():
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: `{key}` must be true or false")
    file_unsafe = switches["unsafe-fixes"]

    if chosen_select is None:
        enabled = {rule.code for rule in rules if rule.default_enabled}
    else:
        enabled = _expand(chosen_select, "select", codes)
    enabled |= _expand(chosen_extend, "extend-select", codes) if chosen_extend else set()
    enabled -= _expand(chosen_ignore, "ignore", codes) if chosen_ignore else set()

    return Settings(
        root=root,
        source=path,
        select=chosen_select,
        ignore=chosen_ignore,
        extend_select=chosen_extend,
        exclude=_strings(table, "exclude", path) or DEFAULT_EXCLUDE,
        extend_exclude=_strings(table, "extend-exclude", path) or (),
        per_file_ignores=per_file_ignores,
        unsafe_fixes=unsafe_fixes if unsafe_fixes is not None else file_unsafe,
        accelerate_config=tuple(root / p for p in (_strings(table, "accelerate-config", path) or ())),
        default_accelerate_config=None if isolated else default_accelerate_config(),
        enabled=frozenset(enabled),
        known=frozenset(codes),
        docs=docs if docs is not None else switches["docs"],
        docstrings=docstrings if docstrings is not None else switches["docstrings"],
    )
