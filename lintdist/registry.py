"""Finds every rule: the engine's own diagnostics and each module of ``lintdist.rules``."""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from lintdist import __version__
from lintdist.rule import Rule


@lru_cache(maxsize=1)
def all_rules() -> tuple[type[Rule], ...]:
    from lintdist import diagnostics, rules

    found: dict[str, type[Rule]] = {}
    modules = [diagnostics] + [
        importlib.import_module(f"{rules.__name__}.{info.name}") for info in pkgutil.iter_modules(rules.__path__)
    ]
    for module in modules:
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Rule) and value.__module__ == module.__name__:
                if value.code in found:
                    raise RuntimeError(f"two rules share the code {value.code}: {found[value.code]} and {value}")
                found[value.code] = value
    return tuple(sorted(found.values(), key=lambda rule: rule.code))


def rule_by_code(code: str) -> type[Rule] | None:
    return next((rule for rule in all_rules() if rule.code == code.upper()), None)


@dataclass(frozen=True)
class RuleInfo:
    """What a run needs to know of a rule before it checks anything: enough to resolve ``--select``."""

    code: str
    default_enabled: bool


def catalogue(folder: Path | None) -> tuple[RuleInfo, ...]:
    """Every rule's code and default. Importing the rules means importing libcst, which costs more than a
    warm run's whole work, so a run with a cache keeps this beside it (``folder``), keyed by lintdist's
    version and the size and modification time of every rule module; None: import the rules."""
    if folder is None:
        return tuple(RuleInfo(rule.code, rule.default_enabled) for rule in all_rules())
    path = folder / "rules.json"
    signature = _signature()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data["signature"] == signature:
            return tuple(RuleInfo(**item) for item in data["rules"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    infos = catalogue(None)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        temporary.write_text(json.dumps({"signature": signature, "rules": [asdict(i) for i in infos]}), "utf-8")
        os.replace(temporary, path)
    except OSError:
        pass  # a read-only checkout imports the rules each time
    return infos


def _signature() -> list:
    from lintdist import diagnostics, rules

    files = [Path(__file__), Path(diagnostics.__file__)]
    for folder in rules.__path__:
        files.extend(sorted(Path(folder).glob("*.py")))
    result: list = [__version__]
    for file in files:
        try:
            stat = file.stat()
        except OSError:
            continue
        result.append([str(file), stat.st_size, stat.st_mtime_ns])
    return result
