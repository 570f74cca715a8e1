"""The real-world set (benchmarks/realworld.tsv) is well formed, and its scorer counts what it says it counts.

The files themselves are public code fetched outside the project, so the scores are not run here; the closing
notes and benchmarks/RESULTS.md give them."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from rules._manifest import RULES

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("realworld", ROOT / "benchmarks" / "realworld.py")
realworld = importlib.util.module_from_spec(_spec)
sys.modules["realworld"] = realworld  # dataclasses look their module up while the class is made
_spec.loader.exec_module(realworld)


def test_the_set_names_real_reports_for_known_rules() -> None:
    cases = realworld.read_cases()
    assert len(cases) >= 40
    codes = {rule["code"] for rule in RULES}
    for case in cases:
        assert case.rule in codes, case
        assert re.fullmatch(r"[0-9a-f]{40}", case.commit), case
        assert re.fullmatch(r"[\w.-]+/[\w.-]+", case.repo), case
        assert case.report.startswith("https://"), case
        assert case.evidence.strip(), case
    assert sum(case.expect == "bug" for case in cases) >= 30
    assert sum(case.expect == "clean" for case in cases) >= 20
    assert len({(c.repo, c.commit, c.path, c.rule) for c in cases}) == len(cases), "a case is listed twice"


def test_the_held_out_set_shares_no_repository_with_the_set() -> None:
    """realworld_holdout.tsv was collected after the rules were tuned on realworld.tsv, from other repositories."""
    held_out = realworld.read_cases(ROOT / "benchmarks" / "realworld_holdout.tsv")
    assert len(held_out) >= 10
    assert {c.repo for c in held_out}.isdisjoint({c.repo for c in realworld.read_cases()})


def test_a_malformed_row_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "set.tsv"
    bad.write_text("\t".join(realworld.COLUMNS) + "\n" + "a/b\tabc\tx.py\tLD201\t3\tbug\thttps://x\twhy\t\n")
    with pytest.raises(ValueError, match="40 hex"):
        realworld.read_cases(bad)


def test_scores_count_found_missed_and_false_alarms() -> None:
    commit = "0" * 40
    case = realworld.Case
    cases = [
        case("o/r", commit, "a.py", "LD201", 10, "bug", "https://r", "e"),
        case("o/r", commit, "b.py", "LD201", 5, "bug", "https://r", "e"),
        case("o/r", commit, "c.py", "LD201", 0, "clean", "https://r", "e"),
        case("o/r", commit, "c.py", "LD202", 0, "clean", "https://r", "e"),
    ]
    finding = realworld.Finding
    findings = {
        f"o+r/{commit}": [
            finding("a.py", "LD201", 12, 12),  # within the tolerance of line 10
            finding("a.py", "LD201", 40, 40),  # another line of a bug file: listed, not scored
            finding("b.py", "LD201", 30, 31),  # too far from line 5: missed
            finding("c.py", "LD201", 7, 9),  # a clean file: false alarm
            finding("c.py", "LD203", 7, 9),  # a rule the set says nothing of in that file
        ]
    }
    scores, lines = realworld.score(cases, findings)
    assert (scores["LD201"].found, scores["LD201"].missed, scores["LD201"].false_alarms) == (1, 1, 1)
    assert scores["LD201"].recall == 0.5 and scores["LD201"].precision == 0.5
    assert scores["LD202"].precision is None
    assert "found (also at 40, not scored)" in lines[0]
    assert (
        lines[1].endswith("MISSED (also at 30, not scored)")
        and lines[2].endswith("FALSE ALARM at 7")
        and lines[3].endswith("clean")
    )


def _snippet_row(**changes: str) -> str:
    row = {
        "id": "owner-repo-12",
        "report": "https://github.com/owner/repo/issues/12",
        "block": "description, python block 1",
        "kind": "py",
        "rule": "LD201",
        "line": "3",
        "expect": "bug",
        "sha256": "0" * 64,
        "evidence": "why",
    }
    row.update(changes)
    return "\t".join(row[column] for column in realworld.SNIPPET_COLUMNS)


def test_a_snippet_set_is_read_by_its_header(tmp_path: Path) -> None:
    good = tmp_path / "snippets.tsv"
    good.write_text("\t".join(realworld.SNIPPET_COLUMNS) + "\n" + _snippet_row() + "\n")
    (snippet,) = realworld.read_cases(good)
    assert isinstance(snippet, realworld.Snippet)
    assert (snippet.path, snippet.folder, snippet.line) == ("owner-repo-12.py", "snippets/owner-repo-12", 3)
    bad_rows = (_snippet_row(kind="txt"), _snippet_row(sha256="abc"), _snippet_row(expect="clean"), _snippet_row(id="a/b"))
    for bad in bad_rows:
        good.write_text("\t".join(realworld.SNIPPET_COLUMNS) + "\n" + bad + "\n")
        with pytest.raises(ValueError, match="sha256"):
            realworld.read_cases(good)


def test_a_snippet_is_placed_alone_only_when_its_text_is_the_labelled_one(tmp_path: Path) -> None:
    import hashlib

    blocks = tmp_path / "blocks"
    blocks.mkdir()
    text = b"    for epoch in range(3):\n        for batch in loader:\n            step(batch)\n"
    (blocks / "owner-repo-12.py").write_bytes(text)
    labelled = realworld.Snippet(
        "owner-repo-12", "https://r", "b", "py", "LD201", 1, "bug", hashlib.sha256(text).hexdigest(), "e"
    )
    edited = realworld.Snippet("owner-repo-12", "https://r", "b", "py", "LD202", 0, "clean", "1" * 64, "e")
    absent = realworld.Snippet("other-repo-3", "https://r", "b", "yaml", "LD301", 0, "clean", "1" * 64, "e")
    problems = realworld.place_snippets([labelled, edited, absent], blocks, tmp_path / "files")
    assert problems == [
        "owner-repo-12.py: its text is not the labelled one (sha256 differs)",
        f"other-repo-3.yaml: not under {blocks}",
    ]
    placed = tmp_path / "files" / "snippets" / "owner-repo-12" / "owner-repo-12.py"
    assert placed.read_bytes() == text.replace(b"\n    ", b"\n").removeprefix(b"    ")  # dedented, as pasted
    findings = {labelled.folder: [realworld.Finding(labelled.path, "LD201", 2, 2)]}
    scores, lines = realworld.score([labelled], findings)
    assert scores["LD201"].found == 1 and lines == ["LD201 bug   snippet owner-repo-12.py:1  found"]


def test_the_snippet_sets_name_real_reports_and_keep_the_held_out_reports_apart() -> None:
    main = realworld.read_cases(ROOT / "benchmarks" / "realworld_snippets.tsv")
    held_out = realworld.read_cases(ROOT / "benchmarks" / "realworld_snippets_holdout.tsv")
    codes = {rule["code"] for rule in RULES}
    for snippet in main + held_out:
        assert isinstance(snippet, realworld.Snippet)
        assert snippet.rule in codes and snippet.report.startswith("https://") and snippet.evidence.strip(), snippet
        assert snippet.block.strip(), snippet
    keys = [(s.id, s.rule, s.line) for s in main + held_out]
    assert len(set(keys)) == len(keys), "a snippet row is listed twice"
    assert {s.report for s in main}.isdisjoint({s.report for s in held_out})
    whole_files = {
        c.report for c in realworld.read_cases() + realworld.read_cases(ROOT / "benchmarks" / "realworld_holdout.tsv")
    }
    assert whole_files.isdisjoint({s.report for s in main + held_out}), "a report is in both kinds of set"
