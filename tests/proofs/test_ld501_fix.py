"""LD501 (off by default) checked on its fixtures with `--select LD501`, and proven by running it: accelerate's
`set_seed(n, device_specific=True)` that the fix writes reproduces the hand-written per-rank seeds exactly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.proofs.harness import fixed_copy, run_ranks

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "ld501"
SOURCES = sorted(p for p in FIXTURES.iterdir() if p.suffix in {".py", ".ipynb"} and ".fixed." not in p.name)


def _variant(source: Path, *kinds: str) -> bytes:
    for kind in kinds:
        path = source.with_name(f"{source.stem}.ld501.{kind}{source.suffix}")
        if path.exists():
            return path.read_bytes()
    return source.read_bytes()


def _cell(finding: dict) -> str:
    return f"cell {finding['cell']}:" if finding.get("cell") is not None else ""


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_fixture_findings_and_fixes(source, tmp_path, lintdist):
    folder = tmp_path / "ld501"
    shutil.copytree(FIXTURES, folder, ignore=shutil.ignore_patterns("*.expected", "*.fixed.*"))
    target = folder / source.name
    found = json.loads(
        lintdist("check", "--no-cache", "--select", "LD501", "--output-format", "json", str(target)).output
    )
    reported = [f"{_cell(f)}{f['line']}:{f['column']}: {f['code']}" for f in found]
    expectation = source.with_name(f"{source.stem}.ld501.expected")
    assert reported == (expectation.read_text().split("\n")[:-1] if expectation.exists() else [])

    lintdist("check", "--no-cache", "--select", "LD501", "--fix", str(target))
    assert target.read_bytes() == _variant(source, "fixed")
    lintdist("check", "--no-cache", "--select", "LD501", "--fix", "--unsafe-fixes", str(target))
    assert target.read_bytes() == _variant(source, "unsafe.fixed", "fixed")


@pytest.mark.slow
def test_set_seed_device_specific_replays_the_hand_written_seeds(tmp_path):
    broken, fixed = fixed_copy("ld501_seeds.py", tmp_path, codes="LD501")
    text = fixed.read_text()
    assert "set_seed(SEED, device_specific=True)" in text and "random.seed(" not in text

    before = run_ranks(broken, tmp_path / "out-broken")
    after = run_ranks(fixed, tmp_path / "out-fixed")
    assert after == before, "set_seed must seed random, numpy and torch exactly as the three calls did"
    assert before[0] != before[1], "the seed is per rank: the ranks draw different numbers"
