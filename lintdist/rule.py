"""The small API every rule is written against: the Rule base class and its examples."""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from lintdist.model import Applicability, Finding, Fix, Severity, Span

if TYPE_CHECKING:
    import libcst as cst

    from lintdist.context import FileContext

Trigger = "str | re.Pattern[str] | Pattern | Words"
DOC_SECTIONS = ("What it does", "Why is this bad?", "Example", "Use instead", "Fix safety", "References")
DOCS_URL = "https://github.com/lintdist/lintdist/blob/main/docs/rules.md#{code}"


@dataclass(frozen=True)
class Valid:
    """A snippet the rule must stay silent on."""

    code: str
    filename: str = "train.py"
    # Other files of the same project (name -> text), for rules that link scripts, configs and launch files.
    project: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Invalid:
    """A snippet the rule must report, with the report's lines and the text after ``--fix``."""

    code: str
    lines: tuple[int, ...]
    fixed: str | None = None
    unsafe_fixed: str | None = None
    filename: str = "train.py"
    project: dict[str, str] = field(default_factory=dict)


class Rule:
    """Base class of every rule.

    A rule is instantiated once per checked file with that file's context. Python
    rules implement ``finish()``, called after the file's one walk, when the facts
    model and its indexes are complete; they may also define ``visit_<Node>`` methods
    (``visit_Call``...), called once per node of that libcst class in source order
    from the same index, before ``finish()``. Configuration and launch-file rules
    implement ``finish()`` alone and read ``self.context``.
    """

    code: ClassVar[str]
    name: ClassVar[str]
    severity: ClassVar[Severity]
    default_enabled: ClassVar[bool] = True
    fix_kind: ClassVar[str] = "none"  # "safe", "unsafe" or "none"
    kinds: ClassVar[frozenset[str]] = frozenset({"python"})
    # Cheap text pre-filter on the rule's entry points: the rule runs on a file only if the text contains one
    # of these strings or matches one of these compiled patterns. With ``also_triggers``, it must contain one of
    # each group as well (a guard and a collective...). ``python_triggers`` replaces ``triggers`` for Python
    # files when a rule's Python entry points are narrower than its config and launch-file ones. A file that
    # no enabled rule wants is not parsed at all (unless named on the command line).
    triggers: ClassVar[tuple[Trigger, ...]] = ()
    python_triggers: ClassVar[tuple[Trigger, ...] | None] = None
    also_triggers: ClassVar[tuple[tuple[Trigger, ...], ...]] = ()
    # The harm needs several processes (work repeated on every rank, a rank left out of a collective): the
    # engine runs no such rule on a Python file whose launch surely runs one process (`TrainingLoop.surely_single`)
    needs_several_processes: ClassVar[bool] = False
    # The rule reads launch files whose only commands are plain `python x.py` lines (the pre-filter skips those)
    plain_python_launches: ClassVar[bool] = False
    VALID: ClassVar[tuple[Valid, ...]] = ()
    INVALID: ClassVar[tuple[Invalid, ...]] = ()

    def __init__(self, context: FileContext) -> None:
        self.context = context

    @property
    def facts(self):
        return self.context.facts

    @property
    def loop(self):
        """The file's training-loop facts (``lintdist.loop.TrainingLoop``), built on first use."""
        from lintdist.loop import TrainingLoop

        return TrainingLoop.of(self.context)

    @property
    def settings(self):
        """The settings this script runs with (``lintdist.launch.LaunchSettings``): its launch's (configs, flags,
        environment) overridden by the keywords its code gives plugins and the ``Accelerator``, with accelerate's
        precedence. Configuration and launch files get their launch's alone."""
        from lintdist.launch import LaunchSettings, code_settings, in_force

        facts = self.context.facts
        if facts is None:
            return self.context.settings or LaunchSettings()
        if "settings" not in facts._memo:
            code = code_settings(facts, self.context.span)
            facts._memo["settings"] = in_force(self.context.settings, code, self.context.display_name)
        return facts._memo["settings"]

    @property
    def launch(self):
        """*Launched how?* (``lintdist.launch.Launch``): the launcher, processes and nodes, whether the launcher
        sets the rendezvous variables, each with where it was said; a field is None where nothing says."""
        from lintdist.launch import script_launch

        return script_launch(self.context)

    @property
    def versions(self):
        """The library versions the project declares (``lintdist.versions.Versions``): ask
        ``self.versions.allows("accelerate", ">=1.6")`` for True, False or None (unknown)."""
        from lintdist.versions import project_versions

        return project_versions(self.context.path)

    def finish(self) -> None:
        """Whole-file analysis, run after the shared traversal. Unless a rule overrides it, it runs the check
        for the file's kind: ``check_python()``, ``check_config(document)`` or ``check_launch(launch)``."""
        kind, context = self.context.kind, self.context
        if kind == "python":
            self.check_python()
        elif kind == "config" and context.config is not None:
            self.check_config(context.config)
        elif kind == "launch" and context.launch is not None:
            self.check_launch(context.launch)

    def check_python(self) -> None:
        """The check of a Python file, for a rule that checks several kinds of file."""

    def check_config(self, document) -> None:
        """The check of a parsed configuration file (``lintdist.sources.ConfigDocument``)."""

    def check_launch(self, launch) -> None:
        """The check of a parsed launch file (``lintdist.sources.LaunchFile``)."""

    def elsewhere(self, facts) -> Rule:
        """This rule, asked of another module of the project (``facts`` from ``self.facts.project``): its
        questions answer there as they would in a check of that module, and it reports nothing here."""
        from lintdist.context import FileContext

        view = facts.project
        context = FileContext(
            path=view.path,
            display_name=view.path.name,
            text=view.text or "",
            kind="python",
            module=facts.index.module,
            index=facts.index,
            names=facts.names,
            facts=facts,
            settings=self.context.settings,
        )
        return type(self)(context)

    def report(
        self,
        node: cst.CSTNode | None,
        message: str,
        *,
        fix: Fix | None = None,
        severity: Severity | None = None,
        span: Span | None = None,
    ) -> None:
        if span is None:
            span = self.context.span(node)
        facts = self.context.facts
        if fix is not None and facts is not None and any(id(old) in facts.stand_ins for old, _ in fix.replacements):
            fix = None  # it would edit a value made in another module: that file's text is not this one's
        made_elsewhere = facts.stand_in_note(node) if facts is not None and node is not None else None
        if made_elsewhere and made_elsewhere not in message:
            message += f" (the value is {made_elsewhere}: the change belongs there)"
        self.context.add(
            Finding(
                code=self.code,
                name=self.name,
                severity=severity or self.severity,
                message=message,
                filename=self.context.display_name,
                span=span,
                fix=fix,
                fix_applicability=fix.applicability if fix else None,
                fix_message=fix.message if fix else None,
                url=self.url(),
            )
        )

    @classmethod
    def wanted(cls, text: str, kind: str = "python") -> bool:
        """Whether the pre-filter lets this rule see ``text`` (a file of ``kind``)."""
        first = cls.python_triggers if kind == "python" and cls.python_triggers is not None else cls.triggers
        return all(any(_found(trigger, text) for trigger in group) for group in (first, *cls.also_triggers))

    @classmethod
    def url(cls) -> str:
        return DOCS_URL.format(code=cls.code.lower())

    @classmethod
    def documentation(cls) -> str:
        return inspect.cleandoc(cls.__doc__ or "")

    @classmethod
    def summary(cls) -> str:
        """The first sentence of "What it does", for tables and SARIF."""
        match = re.search(r"## What it does\s+(.+?)(?:\n\n|$)", cls.documentation(), re.DOTALL)
        text = " ".join(match.group(1).split()) if match else cls.name
        return text.split(". ")[0].rstrip(".") + "."

    @classmethod
    def fix_applicability(cls) -> Applicability | None:
        return None if cls.fix_kind == "none" else Applicability(cls.fix_kind)


def _found(trigger: Trigger, text: str) -> bool:
    return trigger in text if isinstance(trigger, str) else bool(trigger.search(text))


# An import of a name that says it is a loader (`from data import build_loader`): a loader made in another
# module of the project (`DataLoader` itself is spelled with a capital L).
IMPORTED_LOADER = re.compile(r"import[^\n]*loader")


@dataclass(frozen=True)
class Pattern:
    """A trigger that costs about a substring search: one of ``needs`` occurs in the text and then, only then,
    ``regex`` matches. (Python's ``re`` scans fast only for a pattern that starts with a literal; ``\\b`` or ``^``
    in front makes it crawl through every file.)"""

    needs: tuple[str, ...]
    regex: re.Pattern[str] | None = None
    # The regex is written for the text read backwards (`kaerb` for `break`): it can start at a rare keyword
    # and look back over the lines before it, where a forward scan would try every `if` line.
    backwards: bool = False

    def search(self, text: str) -> bool:
        if not any(need in text for need in self.needs):
            return False
        if self.regex is None:
            return True
        return self.regex.search(text[::-1] if self.backwards else text) is not None


class Words:
    """A trigger matching any of ``names`` as a whole identifier (``rank`` but not ``ranking``)."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self._patterns: dict[str, re.Pattern[str]] = {}
        self._stems = _stems(names)

    def search(self, text: str) -> bool:
        # a name absent from the text costs a scan: the names are scanned for only where a stem they share
        # (``rank`` for ``local_rank``, ``get_rank``, ...) occurs
        return any(
            stem in text and any(name in text and self._pattern(name).search(text) for name in names)
            for stem, names in self._stems
        )

    def _pattern(self, name: str) -> re.Pattern[str]:
        # the literal first, then the boundary checks behind and ahead of it: a fast scan (compiled on first use)
        if name not in self._patterns:
            self._patterns[name] = re.compile(rf"{re.escape(name)}(?<!\w{re.escape(name)})(?!\w)")
        return self._patterns[name]


def _stems(names: tuple[str, ...]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The names grouped under a part of at least four characters that several share (``rank`` in ``local_rank``
    and ``get_rank``; parts split at ``_``), the part most share first; a name that shares none is its own
    stem."""
    left, stems = list(names), []
    while left:
        counts: dict[str, int] = {}
        for name in left:
            for part in {part for part in name.split("_") if len(part) >= 4}:
                counts[part] = counts.get(part, 0) + 1
        stem = max(counts, key=lambda part: (counts[part], len(part), part), default=None)
        if stem is None or counts[stem] < 2:
            stems.extend((name, (name,)) for name in left)
            break
        stems.append((stem, tuple(name for name in left if stem in name)))
        left = [name for name in left if stem not in name]
    return tuple(stems)


def words(*names: str) -> Words:
    return Words(tuple(sorted(set(names))))
