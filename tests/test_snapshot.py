"""Every finding and every fix, pinned: the JSON output and the unsafe-fix diff of all of ``fixtures/``
and the findings of every rule example, compared with copies stored in ``tests/data/snapshot/``.

The copies are the reference for engine changes that must not change behaviour (issue 8). They
are regenerated only on purpose, in a commit of their own:

    LINTDIST_REGENERATE_SNAPSHOT=1 python -m pytest tests/test_snapshot.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.test_rule_examples import RULES, _check

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOT = ROOT / "tests" / "data" / "snapshot"
REGENERATE = os.environ.get("LINTDIST_REGENERATE_SNAPSHOT") == "1"


def _compare(name: str, actual: str) -> None:
    stored = SNAPSHOT / name
    if REGENERATE:
        stored.parent.mkdir(parents=True, exist_ok=True)
        stored.write_text(actual)
    assert stored.exists(), f"{stored} is missing: regenerate it on purpose (see this module's docstring)"
    assert actual == stored.read_text(), f"output differs from {stored}"


def test_fixture_findings_json_unchanged(lintdist):
    result = lintdist("check", "--no-cache", "--select", "ALL", "--output-format", "json", "fixtures", cwd=ROOT)
    assert result.exit_code == 1, result.output
    _compare("fixtures-findings.json", json.dumps(json.loads(result.output), indent=1, sort_keys=True) + "\n")


def test_fixture_fixes_unchanged(lintdist):
    result = lintdist("check", "--no-cache", "--select", "ALL", "--unsafe-fixes", "--diff", "fixtures", cwd=ROOT)
    assert result.exit_code == 1, result.output
    _compare("fixtures-fixes.diff", result.output)


@pytest.fixture(scope="module")
def example_root(tmp_path_factory):
    return tmp_path_factory.mktemp("examples")


def test_rule_example_findings_unchanged(example_root):
    lines = []
    for rule in RULES:
        for kind in ("VALID", "INVALID"):
            for index, example in enumerate(getattr(rule, kind)):
                folder = example_root / f"{rule.code}-{kind}-{index}"
                folder.mkdir()
                findings, *_ = _check(rule, example, folder)
                for finding in findings:
                    data = json.dumps(finding.to_json(), sort_keys=True)
                    # a message may name a linked config by its path, which holds the temporary folder
                    for spelling in (os.path.relpath(folder), str(folder)):
                        data = data.replace(spelling, f"<{folder.name}>")
                    lines.append(f"{rule.code} {kind} {index}: " + data)
    _compare("rule-examples.jsonl", "\n".join(lines) + "\n")
