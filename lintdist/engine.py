"""Checks one file: pre-filter, one parse, one traversal for all rules, suppressions, and fixes."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path

import libcst as cst

from lintdist.context import FileContext
from lintdist.conventions import trigger_text
from lintdist.facts import PythonFacts
from lintdist.launch import LaunchSettings
from lintdist.model import Applicability, Finding, Fix, Severity, Span, TextEdit
from lintdist.modules import in_project
from lintdist.names import NameResolver
from lintdist.project import ProjectView, process_project
from lintdist.registry import rule_by_code
from lintdist.rule import Rule
from lintdist.sources import CONFIG_MARKERS, LAUNCHERS, PYTHON_RUN, SourceError, launch_text, parse_config, parse_launch
from lintdist.syntax import SyntaxIndex

IGNORE_FILE = re.compile(r"#\s*lintdist:\s*ignore-file\b")
LINE_SUPPRESSION = re.compile(r"#\s*(?:noqa|lintdist:\s*ignore)\s*(?::\s*|\[)([A-Za-z0-9,\s]+)\]?", re.IGNORECASE)
MAX_FIX_ROUNDS = 10


class InternalError(Exception):
    """A rule crashed: reported with the file and rule, exit code 2."""


def source_error_finding(error: SourceError, display: str) -> Finding:
    rule = rule_by_code(error.code)
    return Finding(
        code=error.code,
        name=rule.name,
        severity=Severity.ERROR,
        message=error.message,
        filename=display,
        span=Span(error.line, error.column, error.line, error.column),
        url=rule.url(),
    )


def suppressed(finding: Finding, lines: list[str]) -> bool:
    """``# noqa: LD201`` or ``# lintdist: ignore[LD201]`` on the reported line (a bare ``# noqa`` does not count)."""
    if not 0 < finding.span.line <= len(lines):
        return False
    for match in LINE_SUPPRESSION.finditer(lines[finding.span.line - 1]):
        codes = {c.strip().upper() for c in re.split(r"[,\s]+", match.group(1)) if c.strip()}
        if finding.code in codes:
            return True
    return False


def check_text(
    text: str,
    *,
    path: Path,
    display: str,
    kind: str,
    rules: list[type[Rule]],
    explicit: bool = True,
    settings: LaunchSettings | None = None,
    module: cst.Module | None = None,
    prefiltered: bool = False,
    blocks: tuple[tuple[int, int], ...] = (),
) -> tuple[list[Finding], FileContext | None]:
    """All findings of ``rules`` in one file's text, suppressions applied (``module``: a parse of ``text``
    already made, for the fix loop; ``prefiltered``: ``rules`` are already those the text's triggers select)."""
    if IGNORE_FILE.search(text):
        return [], None
    # Rules whose entry points are absent from the text cannot fire. A Python file no rule can fire on is not
    # parsed (so LD001 covers the Python files lintdist analyses), unless it was named explicitly: then it is
    # parsed and its syntax errors are reported, but nothing else is paid for. Configs and launch files that
    # carry accelerate/DeepSpeed keys or launcher lines are read by the project pass anyway: they are parsed.
    if not prefiltered:
        searched = trigger_text(text) if kind == "python" else text
        rules = [rule for rule in rules if kind in rule.kinds and rule.wanted(searched, kind)]
    if not explicit and not _worth_parsing(text, kind, rules):
        return [], None
    context = FileContext(path=path, display_name=display, text=text, kind=kind, settings=settings, blocks=blocks)
    try:
        if kind == "python":
            _run_python(context, rules, module)
        elif kind == "config":
            context.config = parse_config(text)
            if context.config is not None:
                _run_plain(context, rules)
        elif kind == "launch":
            context.launch = parse_launch(launch_text(text, path))
            _run_plain(context, rules)
    except SourceError as error:
        return [source_error_finding(error, display)], context
    lines = text.splitlines()
    findings = [f for f in context.findings if not suppressed(f, lines)]
    return sorted(findings, key=lambda f: f.sort_key), context


def _worth_parsing(text: str, kind: str, rules: list[type[Rule]]) -> bool:
    """The cheap pre-filter: Python files no rule wants, and files that do not look like configs or launch
    files, are skipped."""
    if kind == "config":
        return CONFIG_MARKERS.search(text) is not None
    if kind == "launch":
        # a file of plain `python x.py` lines only for the rules that read those
        return LAUNCHERS.search(text) is not None or (
            any(rule.plain_python_launches for rule in rules) and PYTHON_RUN.search(text) is not None
        )
    return bool(rules)


def _run_python(context: FileContext, rules: list[type[Rule]], module: cst.Module | None = None) -> None:
    project = process_project()
    if module is None and rules:
        known = project.parsed(context.path, context.text)
        if known is not None:  # another module's question parsed this file already: its facts are this file's
            context.module, context.index, context.names, context.facts = (
                known.index.module,
                known.index,
                known.names,
                known,
            )
            known.block_of = context.block_of if context.blocks else None
            _run_rules_recorded(context, rules, project)
            return
    if module is None:
        try:
            module = cst.parse_module(context.text)
        except cst.ParserSyntaxError as error:
            raise _syntax_error(context.text, error) from error
        except RecursionError as error:
            raise SourceError("LD001", "the file is nested too deeply to parse") from error
    context.module = module
    if not rules:
        return
    context.index = SyntaxIndex(module)
    context.names = NameResolver(context.index)
    context.facts = PythonFacts(context.index, context.names)
    context.facts.block_of = context.block_of if context.blocks else None
    if in_project(context.path):
        context.facts.project = ProjectView(project, context.path, context.text)
        project.adopt(context.path, context.text, context.facts)
    _run_rules_recorded(context, rules, project)


def _run_rules_recorded(context: FileContext, rules: list[type[Rule]], project) -> None:
    """Run the rules, noting the project's other files their questions read (the cache depends on them)."""
    if context.facts.project is None:
        _run_rules(context, rules)
        return
    with project.recording() as read:
        _run_rules(context, rules)
    own = context.path.resolve()
    context.dependencies = sorted(path for path in read if path != own)


def _run_rules(context: FileContext, rules: list[type[Rule]]) -> None:
    instances = [rule(context) for rule in rules]
    _replay_visits(context.index, instances, context)
    for rule in instances:
        _finish(rule, context)


def _replay_visits(index: SyntaxIndex, instances: list[Rule], context: FileContext) -> None:
    """Call the rules' ``visit_<Node>`` methods on the indexed nodes, in source order, as a traversal would."""
    handlers: dict[type, list] = {}
    for rule in instances:
        for node_class, attribute in _visit_methods(type(rule)):
            handlers.setdefault(node_class, []).append(getattr(rule, attribute))
    if not handlers:
        return
    for node in index.nodes(*handlers):
        for handler in handlers.get(type(node), ()):  # visit_X is for class X itself, as in libcst
            try:
                handler(node)
            except Exception as error:
                raise InternalError(
                    f"{handler.__self__.code} crashed on {context.display_name}: {type(error).__name__}: {error}"
                ) from error


@cache
def _visit_methods(rule: type[Rule]) -> tuple[tuple[type, str], ...]:
    """A rule class's ``visit_<Node>`` methods, with their libcst node classes."""
    found = []
    for attribute in dir(rule):
        if attribute.startswith("visit_"):
            node_class = getattr(cst, attribute[len("visit_") :], None)
            if isinstance(node_class, type):
                found.append((node_class, attribute))
    return tuple(found)


def _syntax_error(text: str, error: cst.ParserSyntaxError) -> SourceError:
    """CPython's own message and position where it has one (it names the missing ``:``), else libcst's."""
    try:
        compile(text, "<lintdist>", "exec", dont_inherit=True)
    except SyntaxError as python_error:
        if python_error.lineno:
            return SourceError(
                "LD001", f"syntax error: {python_error.msg}", python_error.lineno, python_error.offset or 1
            )
    except (ValueError, RecursionError, MemoryError):
        pass
    return SourceError("LD001", f"syntax error: {error.message}", error.raw_line, error.raw_column + 1)


def _run_plain(context: FileContext, rules: list[type[Rule]]) -> None:
    for rule in rules:
        _finish(rule(context), context)


def _finish(rule: Rule, context: FileContext) -> None:
    try:
        if rule.needs_several_processes and context.kind == "python" and rule.loop.surely_single:
            return
        rule.finish()
    except Exception as error:  # a rule bug must name itself and the file, not kill the run silently
        raise InternalError(
            f"{rule.code} crashed on {context.display_name}: {type(error).__name__}: {error}"
        ) from error


# -- fixes ----------------------------------------------------------------------------------


def apply_python_fixes(module: cst.Module, fixes: list[Fix]) -> str:
    from lintdist.edits import replace_nodes

    updated = replace_nodes(module, [pair for fix in fixes for pair in fix.replacements])
    imports = sorted({item for fix in fixes for item in fix.imports})
    if imports:
        # libcst's codemod machinery is heavy to import: loaded only when a fix adds an import.
        from libcst.codemod import CodemodContext
        from libcst.codemod.visitors import AddImportsVisitor

        codemod = CodemodContext()
        for module_name, name in imports:
            AddImportsVisitor.add_needed_import(codemod, module_name, name)
        updated = AddImportsVisitor(codemod).transform_module(updated)
    stale = sorted({item for fix in fixes for item in fix.stale_imports}, key=str)
    if stale:
        from libcst.codemod import CodemodContext
        from libcst.codemod.visitors import RemoveImportsVisitor

        codemod = CodemodContext()
        for module_name, name in stale:
            RemoveImportsVisitor.remove_unused_import(codemod, module_name, name)
        updated = RemoveImportsVisitor(codemod).transform_module(updated)
    return updated.code


def apply_text_edits(text: str, edits: list[TextEdit]) -> str:
    for edit in sorted(edits, key=lambda e: e.start, reverse=True):
        text = text[: edit.start] + edit.replacement + text[edit.end :]
    return text


def _fix_extent(finding: Finding, context: FileContext) -> tuple[tuple[int, int], tuple[int, int]]:
    """The region a fix touches, to keep the fixes of one round from overlapping."""
    fix = finding.fix
    if fix.edits:
        return (min(e.start for e in fix.edits), 0), (max(e.end for e in fix.edits), 0)
    spans = [context.span(old) for old, _ in fix.replacements] or [finding.span]
    return min((s.line, s.column) for s in spans), max((s.end_line, s.end_column) for s in spans)


def render_fix(context: FileContext, fix: Fix) -> str:
    """The checked text with one finding's fix applied."""
    return _render(context, [fix])


def _render(context: FileContext, fixes: list[Fix]) -> str:
    if context.kind == "python":
        return apply_python_fixes(context.module, fixes)
    return apply_text_edits(context.text, [e for fix in fixes for e in fix.edits])


def _parses(text: str, kind: str, parsed: dict[str, cst.Module]) -> bool:
    """Whether a fix's result parses; a Python parse is kept in ``parsed`` for the next round's check."""
    try:
        if kind == "python":
            parsed[text] = cst.parse_module(text)
        elif kind == "config":
            parse_config(text)
    except (cst.ParserSyntaxError, SourceError, RecursionError):
        return False
    return True


def _refusal(text: str, kind: str, parsed: dict[str, cst.Module], fits: Callable[[str], bool] | None) -> str | None:
    """Why a fix's result cannot be written, or None."""
    if not _parses(text, kind, parsed):
        return "its result does not parse"
    if fits is not None and not fits(text):
        return "it needs a line outside the page's code block"
    return None


@dataclass
class FixOutcome:
    text: str
    applied: int = 0
    dropped: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)


def fix_text(
    text: str,
    *,
    path: Path,
    display: str,
    kind: str,
    rules: list[type[Rule]],
    unsafe: bool,
    settings=None,
    explicit: bool = True,
    fits: Callable[[str], bool] | None = None,
    blocks: tuple[tuple[int, int], ...] = (),
) -> FixOutcome:
    """Apply applicable fixes, re-check, and repeat until nothing changes (bounded).

    A fix whose result does not parse, or that ``fits`` refuses (a documentation page's code block cannot hold
    it), is dropped and reported, never written.
    """
    outcome = FixOutcome(text)
    allowed = {Applicability.SAFE, Applicability.UNSAFE} if unsafe else {Applicability.SAFE}
    refused: set[tuple[str, str]] = set()
    checked = None
    before: int | None = None
    parsed: dict[str, cst.Module] = {}
    common = {
        "path": path,
        "display": display,
        "kind": kind,
        "rules": rules,
        "settings": settings,
        "explicit": explicit,
        "blocks": blocks,
    }
    for _ in range(MAX_FIX_ROUNDS):
        findings, context = check_text(outcome.text, module=parsed.pop(outcome.text, None), **common)
        outcome.findings, checked = findings, outcome.text
        before = len(findings) if before is None else before
        fixable = [
            f for f in findings if f.fix and f.fix.applicability in allowed and (f.code, f.message) not in refused
        ]
        if not fixable or context is None:
            break
        chosen, taken = [], []
        extents = sorted(((_fix_extent(f, context), f) for f in fixable), key=lambda item: item[0])
        for (start, end), finding in extents:
            if all(end <= s or start >= e for s, e in taken):
                chosen.append(finding)
                taken.append((start, end))
        new_text = _render(context, [f.fix for f in chosen])
        if _refusal(new_text, kind, parsed, fits) is not None:
            good = []
            for finding in chosen:
                reason = _refusal(_render(context, [*[g.fix for g in good], finding.fix]), kind, parsed, fits)
                if reason is None:
                    good.append(finding)
                else:
                    refused.add((finding.code, finding.message))
                    outcome.dropped.append(f"{finding.code} fix at line {finding.span.line} dropped: {reason}")
            chosen = good
            new_text = _render(context, [f.fix for f in chosen])
        if new_text == outcome.text:
            break
        outcome.text = new_text
    if checked != outcome.text:
        outcome.findings, _ = check_text(outcome.text, module=parsed.pop(outcome.text, None), **common)
    if outcome.text != text:
        # Counted as findings gone, not fixes applied: one fix may settle several findings (one `with` block).
        outcome.applied = max(before - len(outcome.findings), 0)
    return outcome


def fix_edits(finding: Finding, context: FileContext) -> list[TextEdit]:
    """The text edits of one finding's fix on its own, for reporters that show fixes as replacements (SARIF)."""
    if finding.fix is None:
        return []
    if finding.fix.edits:
        return list(finding.fix.edits)
    new = _render(context, [finding.fix])
    old_lines, new_lines = context.text.splitlines(keepends=True), new.splitlines(keepends=True)
    offsets = [0]
    for line in old_lines:
        offsets.append(offsets[-1] + len(line))
    edits = []
    import difflib  # only the reporters that show a fix as text edits (SARIF) pay for it

    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=old_lines, b=new_lines, autojunk=False).get_opcodes():
        if tag != "equal":
            edits.append(TextEdit(offsets[i1], offsets[i2], "".join(new_lines[j1:j2])))
    return edits


def with_edits(findings: list[Finding], context: FileContext | None) -> list[Finding]:
    if context is None:
        return findings
    return [replace(f, edits=tuple(fix_edits(f, context))) if f.fix else f for f in findings]
