"""Finds every rule: the engine's own diagnostics and each module of ``lintdist.rules``."""

from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache

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
