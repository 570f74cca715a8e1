"""Runs a whole check: discovery, the project pass, the cache, parallel workers, fixes and writes."""

from __future__ import annotations

import gc
import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from lintdist.config import Settings
from lintdist.diagnostics import UnreadableFile
from lintdist.discover import Candidate, discover, kind_of
from lintdist.launch import LaunchSettings, build_project
from lintdist.model import Finding, Severity, Span
from lintdist.sources import (
    CONFIG_MARKERS,
    LAUNCHERS,
    PYTHON_RUN,
    SourceError,
    launch_text,
    parse_config,
    parse_launch,
    read_source,
)

if TYPE_CHECKING:
    from lintdist.notebook import Notebook

# Below this many files, starting worker processes costs more than it saves.
PARALLEL_THRESHOLD = 8


@dataclass(frozen=True)
class Task:
    candidate: Candidate
    codes: frozenset[str]
    settings: LaunchSettings | None
    mode: str  # "check", "fix" or "diff"
    unsafe: bool
    want_edits: bool
    docstrings: bool = False  # also check the examples in a Python file's docstrings


@dataclass
class FileReport:
    display: str
    findings: list[dict]
    diff: str = ""
    applied: int = 0
    dropped: list[str] = field(default_factory=list)
    error: str | None = None
    # the project's other files the check read: path -> [size, mtime_ns, content digest]
    dependencies: dict[str, list] = field(default_factory=dict)


@dataclass
class RunResult:
    findings: list[Finding]
    reports: list[FileReport]
    internal_errors: list[str]


def process(task: Task) -> FileReport:
    """Check (and maybe fix) one file. Runs in a worker process; everything it returns is plain data."""
    # The engine (libcst, the rules) is imported by the first file that is not in the cache.
    from lintdist.engine import source_error_finding

    candidate = task.candidate
    try:
        source = read_source(candidate.path, candidate.kind)
    except SourceError as error:
        report = FileReport(candidate.display, [])
        if error.code in task.codes:
            report.findings = [source_error_finding(error, candidate.display).to_json()]
        return report
    report, new_text = process_text(task, source.text)
    if new_text is not None and task.mode == "fix":
        write_atomically(candidate.path, new_text.encode(source.encoding))
        from lintdist.project import process_project

        process_project().forget(candidate.path)  # the other modules' questions read the new text
    return report


def process_text(task: Task, text: str) -> tuple[FileReport, str | None]:
    """Check (and maybe fix) a file's decoded text, as ``process`` does for the file on disk (the language
    server checks unsaved buffers with it). Returns the report and, in fix or diff mode, the new text when a
    fix changed it."""
    from lintdist.engine import InternalError, check_text, fix_text, source_error_finding, with_edits
    from lintdist.registry import rules_for, rules_wanted

    candidate = task.candidate
    report = FileReport(candidate.display, [])
    source_text = text
    new_text: str | None = None
    try:
        notebook = None
        if candidate.kind == "notebook":
            from lintdist.notebook import read_notebook  # and json: only a notebook loads them

            notebook = read_notebook(source_text)
    except SourceError as error:
        if error.code in task.codes:
            report.findings = [source_error_finding(error, candidate.display).to_json()]
        return report, None
    if candidate.kind == "page":
        return _process_page(task, source_text)
    text, kind = (source_text, candidate.kind) if notebook is None else (notebook.python, "python")
    common = {
        "path": candidate.path,
        "display": candidate.display,
        "kind": kind,
        # a check imports only the rules the text can trigger; a fix re-checks its own output, where another
        # rule's entry point may appear, so it runs every enabled rule (each still pre-filtered per round)
        "rules": rules_wanted(task.codes, text, kind) if task.mode == "check" else rules_for(task.codes),
        "settings": task.settings,
    }
    try:
        if task.mode == "check":
            findings, context = check_text(text, explicit=candidate.explicit, prefiltered=True, **common)
            if task.want_edits and notebook is None:
                findings = with_edits(findings, context)
            if context is not None and context.dependencies:
                report.dependencies = dependency_stamps(context.dependencies)
        else:
            outcome = fix_text(text, unsafe=task.unsafe, explicit=candidate.explicit, **common)
            findings, report.applied, report.dropped = outcome.findings, outcome.applied, outcome.dropped
            if outcome.text != text:
                if notebook is None:
                    new_text = outcome.text
                else:
                    from lintdist.notebook import write_notebook

                    new_text = write_notebook(notebook, outcome.text)
                if task.mode == "diff":
                    report.diff = _diff(candidate.display, source_text, new_text)
    except InternalError as error:
        report.error = str(error)
        return report, None
    if notebook is not None:
        findings = [_in_cell(f, notebook) for f in findings]
    if task.docstrings and kind == "python" and notebook is None:
        outcome = _page_outcome(task, source_text if new_text is None else new_text, docstrings=True)
        findings = sorted([*findings, *outcome.findings], key=lambda f: f.sort_key)
        report.applied += outcome.applied
        report.dropped += outcome.dropped
        if outcome.text != (source_text if new_text is None else new_text):
            new_text = outcome.text
            report.diff = _diff(candidate.display, source_text, new_text) if task.mode == "diff" else ""
    report.findings = [f.to_json(with_edits=task.want_edits) for f in findings if f.code in task.codes]
    return report, new_text


def _page_outcome(task: Task, text: str, docstrings: bool = False):
    from lintdist.documents import check_page

    candidate = task.candidate
    return check_page(
        text,
        path=candidate.path,
        display=candidate.display,
        codes=task.codes,
        fix=task.mode != "check",
        unsafe=task.unsafe,
        docstrings=docstrings,
    )


def _process_page(task: Task, text: str) -> tuple[FileReport, str | None]:
    """A documentation page: the code of its blocks, checked and fixed in place (``lintdist.documents``)."""
    from lintdist.engine import InternalError

    report = FileReport(task.candidate.display, [])
    try:
        outcome = _page_outcome(task, text)
    except InternalError as error:
        report.error = str(error)
        return report, None
    report.findings = [f.to_json() for f in outcome.findings if f.code in task.codes]
    report.applied, report.dropped = outcome.applied, outcome.dropped
    if outcome.text == text:
        return report, None
    if task.mode == "diff":
        report.diff = _diff(task.candidate.display, text, outcome.text)
    return report, outcome.text


def _diff(display: str, old: str, new: str) -> str:
    import difflib  # only --diff needs it: start-up does not pay for it

    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True), fromfile=display, tofile=display
        )
    )


def dependency_stamps(paths: list[Path]) -> dict[str, list]:
    """What the cache checks to know that a file the check read is unchanged."""
    from lintdist.cache import file_digest

    stamps = {}
    for path in paths:
        try:
            stat = path.stat()
            stamps[str(path)] = [stat.st_size, stat.st_mtime_ns, file_digest(path.read_bytes())]
        except OSError:
            stamps[str(path)] = [-1, -1, ""]
    return stamps


def _in_cell(finding: Finding, notebook: Notebook) -> Finding:
    cell, line = notebook.location(finding.span.line)
    _, end_line = notebook.location(finding.span.end_line)
    span = Span(line, finding.span.column, end_line, finding.span.end_column)
    return replace(finding, span=span, cell=cell)


def write_atomically(path: Path, data: bytes) -> None:
    """Write beside the file and rename over it, keeping its permission bits."""
    import tempfile

    mode = path.stat().st_mode
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".lintdist")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.chmod(temporary, mode & 0o7777)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def _project_pass(candidates: list[Candidate], settings: Settings):
    """Read configs and launch files once (the checked ones, and those beside checked scripts),
    and link each script to the settings that run it."""
    display = {c.path: c.display for c in candidates}
    files = [(c.path, c.kind) for c in candidates if c.kind in {"config", "launch", "page"}]
    for folder in sorted({c.path.parent for c in candidates if c.kind == "python"}):
        try:
            entries = sorted(folder.iterdir())
        except OSError:
            continue
        for path in entries:
            kind = kind_of(path, explicit=False)
            if kind in {"config", "launch", "page"} and path not in display and path.is_file():
                display[path] = os.path.relpath(path)
                files.append((path, kind))
    configs, launches = {}, {}
    for path, kind in files:
        try:
            text = read_source(path, kind).text
            if kind == "config" and CONFIG_MARKERS.search(text):
                document = parse_config(text)
                if document is not None:
                    configs[path] = document
            elif kind in {"launch", "page"} and (LAUNCHERS.search(text) or PYTHON_RUN.search(text)):
                launches[path] = (parse_launch(launch_text(text, path)), text)
        except SourceError:
            continue  # a checked file reports it in its own check
    project = build_project(
        configs,
        launches,
        [c.path for c in candidates if c.kind == "python"],
        list(settings.accelerate_config),
        display,
        _load_config_document,
        settings.default_accelerate_config,
    )
    _inherit_settings(project, [c.path for c in candidates if c.kind == "python"])
    return project


def _inherit_settings(project, scripts: list[Path], depth: int = 2) -> None:
    """A module the linked scripts import runs under their settings (a trainer class in ``trainlib/`` under
    ``train.py``'s FSDP config), when no link of its own says otherwise and the scripts that import it agree;
    imports are followed ``depth`` deep, from the text (nothing is parsed here)."""
    from lintdist.modules import imported_files

    checked = {path.resolve() for path in scripts}
    choices: dict[Path, dict[tuple, LaunchSettings]] = {}
    for script in sorted(checked):
        settings = project.settings_for(script)
        if settings is None:
            continue
        pending, seen = [(script, 0)], {script}
        while pending:
            current, level = pending.pop()
            try:
                text = read_source(current, "python").text
            except SourceError:
                continue
            for module in imported_files(current, text):
                if module not in seen:
                    seen.add(module)
                    choices.setdefault(module, {})[settings.fingerprint()] = settings
                    if level + 1 < depth:
                        pending.append((module, level + 1))
    for module, found in choices.items():
        if module in checked and project.settings_for(module) is None and len(found) == 1:
            project.links[os.path.realpath(module)] = next(iter(found.values()))


def launch_settings_for(script: Path, settings: Settings) -> LaunchSettings | None:
    """The launch settings the project pass links to one script (for checking a single text, as the examples do)."""
    candidates, _ = discover([str(script)], settings)
    return _project_pass(candidates, settings).settings_for(script)


def _load_config_document(path: Path):
    try:
        return parse_config(read_source(path, "config").text)
    except SourceError:
        return None


# The cyclic garbage collector's thresholds for a run (as mypy sets its own): a parse makes hundreds of thousands
# of small objects and no cycles, and at Python's default (700) the full collections that walk every live
# object, the modules kept for other modules' questions among them, cost up to a fifth of a run.
GC_THRESHOLDS = (200_000, 30, 30)


def run(
    paths: list[str],
    settings: Settings,
    *,
    mode: str = "check",
    unsafe: bool = False,
    jobs: int | None = None,
    use_cache: bool = True,
    want_edits: bool = False,
) -> RunResult:
    thresholds = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)  # worker processes start from this process, with the same thresholds
    try:
        return _run(paths, settings, mode, unsafe, jobs, use_cache, want_edits)
    finally:
        gc.set_threshold(*thresholds)


def _run(paths, settings, mode, unsafe, jobs, use_cache, want_edits) -> RunResult:
    candidates, discovery_errors = discover(paths, settings)
    findings: list[Finding] = []
    for error in discovery_errors if UnreadableFile.code in settings.enabled else ():
        span = Span(1, 1, 1, 1)
        rule = UnreadableFile
        findings.append(
            Finding(rule.code, rule.name, Severity.ERROR, error.message, error.display, span, url=rule.url())
        )

    project = _project_pass(candidates, settings)
    if "lintdist.project" in sys.modules:  # files may have changed since an earlier run in this process
        sys.modules["lintdist.project"].reset_process_project()

    tasks = []
    for candidate in candidates:
        try:
            relative = candidate.path.absolute().relative_to(settings.root).as_posix()
        except ValueError:
            relative = candidate.path.as_posix()
        codes = settings.enabled_for(relative)
        launch = project.settings_for(candidate.path) if candidate.kind == "python" else None
        tasks.append(Task(candidate, codes, launch, mode, unsafe, want_edits, settings.docstrings))

    cache = None
    if use_cache and mode == "check":
        from lintdist.cache import ResultCache

        cache = ResultCache(settings.root, settings.fingerprint())
    from lintdist.versions import project_versions  # a cached result depends on the declared versions too

    # one look at the manifests per folder, not per file
    versions_by_folder: dict[Path, tuple] = {}

    def versions_key(path: Path) -> tuple:
        if path.parent not in versions_by_folder:
            versions_by_folder[path.parent] = project_versions(path).fingerprint()
        return versions_by_folder[path.parent]

    reports: dict[int, FileReport] = {}
    pending: list[tuple[int, Task, str | None]] = []
    for index, task in enumerate(tasks):
        extra = (
            task.candidate.kind,
            task.candidate.display,
            task.candidate.explicit,
            sorted(task.codes),
            task.settings.fingerprint() if task.settings else None,
            versions_key(task.candidate.path) if cache is not None else None,
            want_edits,
        )
        if cache is not None:
            cached, digest = cache.lookup(task.candidate.display, task.candidate.path, extra)
            if cached is not None:
                reports[index] = FileReport(task.candidate.display, cached)
                continue
            pending.append((index, task, digest))
        else:
            pending.append((index, task, None))

    workers = jobs or os.cpu_count() or 1
    if workers > 1 and len(pending) >= PARALLEL_THRESHOLD:
        from concurrent.futures import ProcessPoolExecutor  # imported only when a pool is worth its start-up

        # the largest files first, one at a time: a long script handed out last would keep one worker busy
        # while the others wait (the order of the results is restored below)
        order = sorted(range(len(pending)), key=lambda i: -_size(pending[i][1].candidate.path))
        with ProcessPoolExecutor(max_workers=min(workers, len(pending))) as pool:
            done = list(pool.map(process, [pending[i][1] for i in order], chunksize=1))
        results = [None] * len(pending)
        for i, report in zip(order, done):
            results[i] = report
    else:
        results = [process(task) for _, task, _ in pending]
    for (index, task, digest), report in zip(pending, results):
        reports[index] = report
        if cache is not None and report.error is None:
            cache.store(task.candidate.display, task.candidate.path, digest, report.findings, report.dependencies)
    if cache is not None:
        cache.save()

    ordered = [reports[i] for i in sorted(reports)]
    for report in ordered:
        findings.extend(Finding.from_json(f) for f in report.findings)
    findings.sort(key=lambda f: f.sort_key)
    return RunResult(findings, ordered, [r.error for r in ordered if r.error])


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
