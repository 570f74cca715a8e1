"""LD203's opt-in fix end to end: each ``fixtures/ld203/<shape>.py`` with a ``<shape>.unsafe.fixed.py`` is fixed
through the CLI with ``--unsafe-fixes`` and must match it, leave no LD201 (set_epoch) or LD202 (shuffle with a
sampler) finding behind, and be stable under a second run. The fix must carry its own ``set_epoch`` insertion:
it is checked with LD203 alone as well as with every default rule."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import libcst as cst
import pytest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "ld203"
FIXABLE = sorted(
    p for p in FIXTURES.glob("*.py") if ".fixed." not in p.name and p.with_suffix(".unsafe.fixed.py").exists()
)


@pytest.mark.parametrize("source", FIXABLE, ids=lambda p: p.stem)
@pytest.mark.parametrize("select", [None, "LD203"], ids=["default-rules", "ld203-alone"])
def test_unsafe_fix_matches_and_leaves_nothing(source, select, tmp_path, lintdist):
    target = tmp_path / source.name
    shutil.copy(source, target)
    selection = ["--select", select] if select else []
    lintdist("check", "--fix", "--no-cache", *selection, str(target))
    assert target.read_bytes() == source.read_bytes(), "the fix is unsafe: --fix alone must not apply it"

    lintdist("check", "--fix", "--unsafe-fixes", "--no-cache", *selection, str(target))
    expected = source.with_suffix(".unsafe.fixed.py").read_bytes()
    assert target.read_bytes() == expected
    cst.parse_module(expected)

    after = lintdist("check", "--no-cache", "--select", "LD201,LD202,LD203", "--output-format", "json", str(target))
    assert json.loads(after.output) == []

    lintdist("check", "--fix", "--unsafe-fixes", "--no-cache", str(target))
    assert target.read_bytes() == expected, "a second fix must change nothing"


def test_every_fixable_shape_has_an_expected_fix():
    assert len(FIXABLE) >= 4
    safe = {p.name.removesuffix(".fixed.py") for p in FIXTURES.glob("*.fixed.py") if ".unsafe." not in p.name}
    # a `<name>.unsafe.fixed.expected` holds what stays in a fixed file (another rule's finding), not a shape
    shapes = {p.stem for p in FIXTURES.glob("*.expected") if not p.stem.endswith(".fixed")}
    unfixed = shapes - {p.stem for p in FIXABLE} - safe
    assert unfixed == {"step_based_iterator"}, "a shape without a fix must be a deliberate one"
