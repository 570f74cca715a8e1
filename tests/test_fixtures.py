"""Lint every bundled fixture and compare with its expectation; prove every expected fix."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import libcst as cst
import pytest
from ruamel.yaml import YAML

from lintdist.config import resolve_settings
from lintdist.runner import run

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SOURCES = sorted(
    p
    for p in FIXTURES.rglob("*")
    if p.suffix in {".py", ".ipynb", ".yaml", ".yml", ".json", ".sh", ".md", ".mdx", ".rst"} and ".fixed." not in p.name
)
FIXED = sorted(p for p in FIXTURES.rglob("*.fixed.*") if p.suffix != ".expected")


def _expected(source: Path) -> list[str]:
    expectation = source.with_suffix(".expected")
    if not expectation.exists():
        return []
    return [line.strip() for line in expectation.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def fixture_findings():
    settings = resolve_settings(None, FIXTURES)
    result = run([str(FIXTURES)], settings, use_cache=False, jobs=1)
    assert result.internal_errors == []
    found: dict[str, list[str]] = {}
    for finding in result.findings:
        cell = f"cell {finding.cell}:" if finding.cell is not None else ""
        found.setdefault(str(Path(finding.filename).resolve()), []).append(
            f"{cell}{finding.span.line}:{finding.span.column}: {finding.code}"
        )
    return found


@pytest.mark.parametrize("source", SOURCES + FIXED, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_fixture_findings_match_expectation(source, fixture_findings):
    expected = _expected(source)  # a fixed file is clean unless an unsafe fix was left: <name>.fixed.expected
    assert fixture_findings.get(str(source), []) == expected


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_fix_gives_expected_output_and_is_idempotent(source, tmp_path, lintdist):
    # The fixture's folder travels with it, so the configs and launch files that run a script stay linked; a
    # project fixture (fixtures/project/<name>/) travels whole, so its modules stay linked too.
    home = _project_root(source) or source.parent
    folder = tmp_path / home.name
    shutil.copytree(home, folder)
    target = folder / source.relative_to(home)
    original = target.read_bytes()

    diff = lintdist("check", "--diff", "--no-cache", str(target))
    assert target.read_bytes() == original, "--diff must write nothing"

    lintdist("check", "--fix", "--no-cache", str(target))
    fixed_path = source.with_name(source.name.replace(source.suffix, ".fixed" + source.suffix))
    expected = fixed_path.read_bytes() if fixed_path.exists() else original
    assert target.read_bytes() == expected
    if fixed_path.exists():
        assert diff.output.startswith(f"--- {target}"), diff.output
        _assert_parses(target)

    second = lintdist("check", "--fix", "--no-cache", "--output-format", "json", str(target))
    assert target.read_bytes() == expected, "a second --fix must change nothing"
    remaining = json.loads(second.output)
    assert [f for f in remaining if (f["fix"] or {}).get("applicability") == "safe"] == [], "every safe fix applied"
    if not fixed_path.exists():
        assert len(remaining) == len(_expected(source))


def _project_root(source: Path) -> Path | None:
    """``fixtures/project/<name>`` for a file of a multi-module fixture."""
    for folder in source.parents:
        if folder.parent == FIXTURES / "project":
            return folder
    return None


def _assert_parses(path: Path) -> None:
    if path.suffix == ".py":
        cst.parse_module(path.read_bytes())
    elif path.suffix in {".yaml", ".yml"}:
        YAML(typ="safe").load(path.read_text())
    elif path.suffix == ".sh":
        shlex.split(path.read_text(), comments=True)
