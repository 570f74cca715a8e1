"""Writes findings as text, concise lines, JSON, SARIF 2.1.0 or GitHub annotations."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import click

from lintdist import __version__
from lintdist.model import Applicability, Finding, Severity
from lintdist.registry import all_rules

SEVERITY_COLOUR = {Severity.ERROR: "red", Severity.WARNING: "yellow", Severity.INFO: "blue"}
SARIF_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}
GITHUB_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def fix_hint(finding: Finding) -> str | None:
    if finding.fix_applicability is None:
        return None
    how = "--fix" if finding.fix_applicability is Applicability.SAFE else "--fix --unsafe-fixes"
    return f"help: {finding.fix_message} ({finding.fix_applicability.value} fix: `lintdist check {how}`)"


def _source_lines(filename: str, cache: dict[str, list[str]]) -> list[str]:
    if filename not in cache:
        try:
            cache[filename] = Path(filename).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            cache[filename] = []
    return cache[filename]


def _headline(f: Finding, colour: bool = False) -> str:
    """``path:line:col: CODE [severity] message``."""
    location = click.style(f"{f.location}:", bold=True) if colour else f"{f.location}:"
    code = click.style(f.code, fg=SEVERITY_COLOUR[f.severity], bold=True) if colour else f.code
    return f"{location} {code} [{f.severity.value}] {f.message}"


def render_text(findings: list[Finding], *, colour: bool) -> str:
    out: list[str] = []
    sources: dict[str, list[str]] = {}
    for f in findings:
        out.append(_headline(f, colour))
        lines = _source_lines(f.filename, sources) if f.cell is None else []
        if 0 < f.span.line <= len(lines):
            number = str(f.span.line)
            line = lines[f.span.line - 1].replace("\t", " ")
            width = max(
                1,
                (f.span.end_column - f.span.column)
                if f.span.end_line == f.span.line
                else len(line) - f.span.column + 1,
            )
            caret = " " * (f.span.column - 1) + "^" * width
            gutter = " " * len(number)
            out.append(f"{gutter} |")
            out.append(f"{number} | {line}")
            out.append(f"{gutter} | " + (click.style(caret, fg=SEVERITY_COLOUR[f.severity]) if colour else caret))
        hint = fix_hint(f)
        if hint:
            out.append(f"  = {hint}")
        out.append("")
    return "\n".join(out)


def render_concise(findings: list[Finding]) -> str:
    return "\n".join(_headline(f) for f in findings)


def render_json(findings: list[Finding]) -> str:
    import json  # only the machine formats load it

    return json.dumps([f.to_json() for f in findings], indent=2)


def render_github(findings: list[Finding]) -> str:
    def escape(value: str, *, property_value: bool = False) -> str:
        value = value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
        return value.replace(":", "%3A").replace(",", "%2C") if property_value else value

    return "\n".join(
        f"::{GITHUB_LEVEL[f.severity]} file={escape(f.filename, property_value=True)},line={f.span.line},"
        f"col={f.span.column},endLine={f.span.end_line},endColumn={f.span.end_column},"
        f"title={escape(f.code + ' ' + f.name, property_value=True)}::{escape(_cell_prefix(f) + f.message)}"
        for f in findings
    )


def render_sarif(findings: list[Finding]) -> str:
    rules = all_rules()
    index = {rule.code: i for i, rule in enumerate(rules)}
    results = []
    for f in findings:
        uri = Path(f.filename).as_posix()
        result = {
            "ruleId": f.code,
            "ruleIndex": index[f.code],
            "level": SARIF_LEVEL[f.severity],
            "message": {"text": _cell_prefix(f) + f.message},
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": {"uri": uri},
                        "region": {
                            "startLine": f.span.line,
                            "startColumn": f.span.column,
                            "endLine": f.span.end_line,
                            "endColumn": f.span.end_column,
                        },
                    }
                }
            ],
        }
        if f.fix_applicability is not None and f.edits:
            result["fixes"] = [
                {
                    "description": {"text": f"{f.fix_message} ({f.fix_applicability.value})"},
                    "artifactChanges": [
                        {
                            "artifactLocation": {"uri": uri},
                            "replacements": [
                                {
                                    "deletedRegion": {"charOffset": e.start, "charLength": e.end - e.start},
                                    "insertedContent": {"text": e.replacement},
                                }
                                for e in f.edits
                            ],
                        }
                    ],
                }
            ]
        results.append(result)
    driver_rules = [
        {
            "id": rule.code,
            "name": rule.name,
            "shortDescription": {"text": rule.summary()},
            "fullDescription": {"text": rule.documentation()},
            "helpUri": rule.url(),
            "defaultConfiguration": {"level": SARIF_LEVEL[rule.severity], "enabled": rule.default_enabled},
        }
        for rule in rules
    ]
    log = {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "lintdist",
                        "version": __version__,
                        "informationUri": "https://github.com/lintdist/lintdist",
                        "rules": driver_rules,
                    }
                },
                "results": results,
            }
        ],
    }
    import json  # only the machine formats load it

    return json.dumps(log, indent=2)


def _cell_prefix(finding: Finding) -> str:
    """Formats without a notion of notebook cells name the cell in the message."""
    return f"cell {finding.cell}: " if finding.cell is not None else ""


def render_statistics(findings: list[Finding]) -> str:
    counts = Counter(f.code for f in findings)
    fixable = {f.code for f in findings if f.fix_applicability is Applicability.SAFE}
    width = len(str(max(counts.values(), default=0)))
    lines = []
    names = {f.code: f.name for f in findings}
    for code, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        marker = "[*]" if code in fixable else "[ ]"
        lines.append(f"{count:>{width}}\t{code}\t{marker} {names[code]}")
    return "\n".join(lines)


def summary(findings: list[Finding], *, unsafe: bool, fixed: int = 0) -> str:
    parts = []
    if fixed:
        parts.append(f"Fixed {fixed} finding{'s' if fixed != 1 else ''}.")
    if not findings:
        parts.append("All checks passed." if not fixed else "No findings remain.")
        return " ".join(parts)
    safe = sum(f.fix_applicability is Applicability.SAFE for f in findings)
    unsafe_count = sum(f.fix_applicability is Applicability.UNSAFE for f in findings)
    fixable = safe + (unsafe_count if unsafe else 0)
    noun = "finding" if len(findings) == 1 else "findings"
    how = "--fix --unsafe-fixes" if unsafe else "--fix"
    parts.append(f"{len(findings)} {noun} ({fixable} fixable with {how})")
    if unsafe_count and not unsafe:
        parts.append(f"{unsafe_count} more fixable with --unsafe-fixes.")
    return " ".join(parts)


def rules_table(markdown: bool = False) -> str:
    rows = []
    for rule in all_rules():
        rows.append((rule.code, rule.name, rule.severity.value, "on" if rule.default_enabled else "off", rule.fix_kind))
    header = ("Code", "Name", "Severity", "Default", "Fix")
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += [f"| [{r[0]}](docs/rules.md#{r[0].lower()}) | `{r[1]}` | {r[2]} | {r[3]} | {r[4]} |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
    return "\n".join("  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip() for row in [header, *rows])


def rules_documentation() -> str:
    """Every rule's documentation as one Markdown page (docs/rules.md)."""
    parts = [
        "# lintdist rules\n",
        "Generated by `lintdist rules --docs`; do not edit by hand.\n",
        rules_table(markdown=True).replace("](docs/rules.md#", "](#"),
        "",
    ]
    for rule in all_rules():
        state = "on" if rule.default_enabled else "off (enable with `--extend-select`)"
        parts.append(f'<a id="{rule.code.lower()}"></a>\n## {rule.code} {rule.name}\n')
        parts.append(f"Severity: {rule.severity.value}. Default: {state}. Fix: {rule.fix_kind}.\n")
        parts.append(("\n" + rule.documentation()).replace("\n## ", "\n### ").lstrip("\n") + "\n")
    return "\n".join(parts)
