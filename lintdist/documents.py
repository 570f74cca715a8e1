"""Checking the code of a documentation page (or of a Python file's docstrings) through the engine.

A page is read as the kinds of files its blocks are: its shell blocks as a launch file (positions are the page's
own), its Python blocks as one program and each accelerate/DeepSpeed YAML block as a config, both line for line
the page's (``lintdist.pages``). Findings are moved to the page's columns; fixes are written into their blocks,
and a fix that would need a line outside them is shown without a fix (and dropped, with a message, under
``--fix``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from lintdist.launch import LaunchSettings
from lintdist.model import Finding, Span
from lintdist.pages import Block, Page, read_docstrings, read_page, write_back
from lintdist.sources import CONFIG_MARKERS, ConfigDocument, SourceError


@dataclass
class PageOutcome:
    text: str  # the page after its fixes (unchanged in check mode)
    findings: list[Finding] = field(default_factory=list)
    applied: int = 0
    dropped: list[str] = field(default_factory=list)


def check_page(
    text: str, *, path: Path, display: str, codes: frozenset[str], fix: bool, unsafe: bool, docstrings: bool = False
) -> PageOutcome:
    """The findings of a page's code (``docstrings``: of a Python file's docstring examples), and in fix mode
    the page with its fixes."""
    from lintdist.engine import check_text, fix_text
    from lintdist.registry import rules_for, rules_wanted

    outcome = PageOutcome(text)
    read = read_docstrings if docstrings else lambda current: read_page(current, path.suffix)

    def run(kind: str, part: str, page: Page | None = None, blocks: list[Block] | None = None) -> None:
        common = {"path": path, "display": display, "kind": kind, "settings": None, "explicit": False}
        if kind == "python":
            common["blocks"] = tuple((block.first + 1, block.last + 1) for block in blocks)
            common["settings"] = None if docstrings else page_launch(outcome.text, path, display)
        if not fix:
            found, context = check_text(part, rules=rules_wanted(codes, part, kind), prefiltered=True, **common)
            if page is not None:
                found = [_placed(_fitting(f, context, page, blocks), page) for f in found]
            outcome.findings += found
            return
        fits = None if page is None else lambda new: write_back(page, blocks, new) is not None
        result = fix_text(part, rules=rules_for(codes), unsafe=unsafe, fits=fits, **common)
        outcome.applied += result.applied
        outcome.dropped += result.dropped
        if result.text != part:
            outcome.text = result.text if page is None else write_back(page, blocks, result.text) or outcome.text

    if not docstrings:
        run("launch", outcome.text)  # its shell blocks, read by the engine in place
    page = read(outcome.text)
    if page.python_blocks():
        run("python", page.python(), page, page.python_blocks())
    first = read(outcome.text)
    for index in (first.blocks.index(block) for block, _ in config_blocks(first)):
        page = read(outcome.text)  # as the fixes before left it
        run("config", page.program([page.blocks[index]]), page, [page.blocks[index]])
    if fix:  # the findings that remain, placed on the fixed page
        outcome.findings = check_page(
            outcome.text, path=path, display=display, codes=codes, fix=False, unsafe=unsafe, docstrings=docstrings
        ).findings
    outcome.findings.sort(key=lambda f: f.sort_key)
    return outcome


def page_launch(text: str, path: Path, display: str) -> LaunchSettings | None:
    """How the page's own shell blocks launch the code it shows ("save it as run.py and launch it with
    ``torchrun --nproc_per_node=2 run.py``"): what all its launch lines agree on, or None where it has none. An
    ``accelerate launch`` line without ``--config_file`` reads the reader's default config: the page's one
    accelerate config block stands for it, and with none (or several) the launch is not known."""
    from lintdist.launch import build_project, reads_default_config
    from lintdist.sources import launch_text, parse_launch

    launch = parse_launch(launch_text(text, path))
    commands = [command for command in launch.commands if command.script is not None]
    if not commands:
        return None
    configs = [
        document for _, document in config_blocks(read_page(text, path.suffix)) if document.flavour == "accelerate"
    ]
    default = path if len(configs) == 1 else None  # the page stands for the config file it shows
    reads_default = [
        command
        for command in commands
        if reads_default_config(command) and not any(flag.name == "config_file" for flag in command.flags)
    ]
    if default is None and reads_default:
        return None
    project = build_project(
        {},
        {path: (launch, text)},
        [],
        [],
        {path: display},
        lambda wanted: configs[0] if wanted == default else None,
        default,
    )
    found = list(project.links.values())
    settings = found[0] if found else None
    for other in found[1:]:
        settings = settings.common(other)
    return settings


def config_blocks(page: Page) -> list[tuple[Block, ConfigDocument]]:
    """The page's YAML blocks that are accelerate or DeepSpeed configs, each parsed with its settings at the page's
    lines. A block that does not parse (a JSON config with a missing comma) is skipped without an error, as a
    Python block that does not parse is."""
    from lintdist.sources import parse_config

    found = []
    for block in page.blocks:
        if block.language == "yaml" and CONFIG_MARKERS.search(block.text):
            try:
                document = parse_config(page.program([block]))
            except SourceError:
                continue
            if document is not None:
                found.append((block, document))
    return found


def _fitting(finding: Finding, context, page: Page, blocks: list[Block]) -> Finding:
    """The finding, without its fix where the fix would need a line outside the page's code blocks."""
    from lintdist.engine import render_fix

    if finding.fix is None or context is None or write_back(page, blocks, render_fix(context, finding.fix)) is not None:
        return finding
    return replace(finding, fix=None, fix_applicability=None, fix_message=None)


def _placed(finding: Finding, page: Page) -> Finding:
    """A finding on a page's program moved to the page's columns."""
    span = finding.span
    moved = Span(
        span.line, span.column + page.shift(span.line), span.end_line, span.end_column + page.shift(span.end_line)
    )
    return replace(finding, span=moved)
