"""Finds every rule: the engine's own diagnostics and each module of ``lintdist.rules``."""

from __future__ import annotations

import importlib
import pkgutil
import re
from dataclasses import dataclass
from functools import cache, cached_property, lru_cache
from typing import TYPE_CHECKING

from lintdist.conventions import trigger_text

if TYPE_CHECKING:
    from lintdist.rule import Rule


@lru_cache(maxsize=1)
def all_rules() -> tuple[type[Rule], ...]:
    from lintdist import diagnostics, rules
    from lintdist.rule import Rule

    found: dict[str, type[Rule]] = {}
    modules = [diagnostics] + [
        importlib.import_module(f"{rules.__name__}.{info.name}")
        for info in pkgutil.iter_modules(rules.__path__)
        if not info.name.startswith("_")  # the generated manifest
    ]
    for module in modules:
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Rule) and value.__module__ == module.__name__:
                if value.code in found:
                    raise RuntimeError(f"two rules share the code {value.code}: {found[value.code]} and {value}")
                found[value.code] = value
    return tuple(sorted(found.values(), key=lambda rule: rule.code))


def rules_for(codes: frozenset[str]) -> list[type[Rule]]:
    return [rule for rule in all_rules() if rule.code in codes]


def rule_by_code(code: str) -> type[Rule] | None:
    return next((rule for rule in all_rules() if rule.code == code.upper()), None)


@dataclass(frozen=True)
class RuleInfo:
    """What a run knows of a rule before it imports it: its code, default, module, the kinds of file it
    reads and its entry points (the pre-filter's triggers), from the generated ``lintdist.rules._manifest``."""

    code: str
    default_enabled: bool
    module: str = ""
    kinds: tuple[str, ...] = ("python",)
    triggers: tuple = ()
    python_triggers: tuple | None = None
    also_triggers: tuple = ()

    def wanted(self, text: str, kind: str, seen: dict | None = None) -> bool:
        """``Rule.wanted`` without importing the rule (and libcst with it). ``seen`` remembers, for one text,
        what each trigger found: rules share many (``accelerat``, ``torch.distributed``, the rank words)."""
        if kind not in self.kinds:
            return False
        groups = self._python_groups if kind == "python" else self._groups
        if seen is None:
            seen = {}
        return all(any(_search(trigger, text, seen) for trigger in group) for group in groups)

    @cached_property
    def _groups(self) -> tuple[tuple, ...]:
        return _cheap_first((self.triggers, *self.also_triggers))

    @cached_property
    def _python_groups(self) -> tuple[tuple, ...]:
        first = self.python_triggers if self.python_triggers is not None else self.triggers
        return _cheap_first((first, *self.also_triggers))


def _cheap_first(groups: tuple[tuple, ...]) -> tuple[tuple, ...]:
    """The groups as compiled triggers, those without a bare regular expression or a set of words first: every
    group must match, so a substring test that fails spares the scans of the costly ones."""
    from lintdist.rule import Pattern

    compiled = [tuple(_trigger(t) for t in group) for group in groups]
    return tuple(sorted(compiled, key=lambda group: not all(isinstance(t, (_Text, Pattern)) for t in group)))


def _search(trigger, text: str, seen: dict) -> bool:
    # a trigger is compiled once per manifest entry (``_trigger`` is cached, and keeps it alive), so the words or
    # pattern two rules share is one object: its answer for this text is remembered under its identity
    key = trigger.text if isinstance(trigger, _Text) else id(trigger)
    found = seen.get(key)
    if found is None:
        found = seen[key] = trigger.text in text if isinstance(trigger, _Text) else bool(trigger.search(text))
    return found


@cache
def manifest() -> tuple[RuleInfo, ...]:
    """Every rule, from the manifest generated from the rule classes (``lintdist rules --manifest``; a test
    keeps it in step): start-up imports no rule module, and a file imports only the rules it can trigger."""
    from lintdist.rules._manifest import RULES

    return tuple(RuleInfo(**entry) for entry in RULES)


def rules_wanted(codes: frozenset[str], text: str, kind: str) -> list[type[Rule]]:
    """The enabled rules whose entry points occur in ``text`` (a file of ``kind``), their modules imported now.
    A Python file is read without the comments it opens with, and with the imports its unbound conventional names
    stand for (``dist.barrier()`` alone wants what ``import torch.distributed as dist`` does): ``trigger_text``."""
    found = []
    seen: dict = {}
    if kind == "python":
        text = trigger_text(text)
    for info in manifest():
        if info.code in codes and info.wanted(text, kind, seen):
            module = importlib.import_module(info.module)
            found.append(next(v for v in vars(module).values() if getattr(v, "code", None) == info.code))
    return found


def manifest_source() -> str:
    """The text of ``rules/_manifest.py``, from the rule classes."""
    lines = ",\n".join(f"    {entry!r}" for entry in manifest_entries(all_rules()))
    return (
        '"""Generated by `lintdist rules --manifest > rules/_manifest.py` from the rule classes: do not edit.\n\n'
        "Each rule's code, default, module, file kinds and entry points, so that start-up imports no rule and a\n"
        'file imports only the rules whose entry points it contains."""\n\n'
        f"RULES = [\n{lines},\n]\n"
    )


def manifest_entries(rules) -> list[dict]:
    """What the manifest says of each of these rule classes."""
    entries = []
    for rule in rules:
        entry = {
            "code": rule.code,
            "default_enabled": rule.default_enabled,
            "module": rule.__module__,
            "kinds": tuple(sorted(rule.kinds)),
            "triggers": tuple(_serial(t) for t in rule.triggers),
        }
        if rule.python_triggers is not None:
            entry["python_triggers"] = tuple(_serial(t) for t in rule.python_triggers)
        if rule.also_triggers:
            entry["also_triggers"] = tuple(tuple(_serial(t) for t in group) for group in rule.also_triggers)
        entries.append(entry)
    return entries


def _serial(trigger) -> tuple:
    """A trigger as plain data: ("text", s), ("regex", pattern, flags), ("pattern", needs, regex, flags[, True
    when it reads backwards]) or ("words", names)."""
    from lintdist.rule import Pattern, Words

    if isinstance(trigger, str):
        return ("text", trigger)
    if isinstance(trigger, Pattern):
        regex = trigger.regex
        serial = ("pattern", tuple(trigger.needs), regex.pattern if regex else None, regex.flags if regex else 0)
        return (*serial, True) if trigger.backwards else serial
    if isinstance(trigger, Words):
        return ("words", tuple(trigger.names))
    return ("regex", trigger.pattern, trigger.flags)


@cache
def _trigger(serial: tuple):
    """The searchable trigger of a manifest entry (compiled once)."""
    from lintdist.rule import Pattern, words

    kind = serial[0]
    if kind == "text":
        return _Text(serial[1])
    if kind == "words":
        return words(*serial[1])
    if kind == "pattern":
        regex = re.compile(serial[2], serial[3]) if serial[2] is not None else None
        return Pattern(serial[1], regex, backwards=len(serial) > 4 and serial[4])
    return re.compile(serial[1], serial[2])


@dataclass(frozen=True)
class _Text:
    text: str

    def search(self, haystack: str) -> bool:
        return self.text in haystack
