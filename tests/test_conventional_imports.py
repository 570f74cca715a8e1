"""Snippets leave imports out: every Python fixture, stripped of its conventional imports, gives the same findings.

``import torch.distributed as dist`` binds ``dist`` to what a snippet without it means by ``dist`` (the table in
``lintdist.conventions``), so removing the module-level imports that bind only conventional names, each to its
conventional meaning, must change no finding: same rule, same column, same line once the removed lines are
accounted for. A file where removing them would change what a name means (a star import; the name bound again
elsewhere) is left whole, and the reason is collected and shown, not hidden.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import libcst as cst
import pytest
from libcst.helpers import get_full_name_for_node
from libcst.metadata import MetadataWrapper, PositionProvider, ScopeProvider

from lintdist.config import resolve_settings
from lintdist.conventions import CONVENTIONAL_NAMES
from lintdist.model import Applicability
from lintdist.runner import run

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


@dataclass(frozen=True)
class Stripped:
    text: str
    removed: tuple[int, ...]  # the 1-based lines taken out, ascending
    kept_because: str | None = None  # why the file is left whole


def conventional_bindings(statement: cst.Import | cst.ImportFrom) -> dict[str, str] | None:
    """name -> qualified name for each name the import binds, or None when one of them is not conventional
    (``import torch.distributed`` binds ``torch``, to ``torch``)."""
    bound: dict[str, str] = {}
    if isinstance(statement, cst.ImportFrom):
        if statement.relative or statement.module is None or isinstance(statement.names, cst.ImportStar):
            return None
        module = get_full_name_for_node(statement.module)
        for alias in statement.names:
            name = get_full_name_for_node(alias.asname.name if alias.asname else alias.name)
            bound[name] = f"{module}.{get_full_name_for_node(alias.name)}"
    else:
        for alias in statement.names:
            real = get_full_name_for_node(alias.name)
            if alias.asname is not None:
                bound[get_full_name_for_node(alias.asname.name)] = real
            else:
                root = real.split(".", 1)[0]
                bound[root] = root
    if all(CONVENTIONAL_NAMES.get(name) == meaning for name, meaning in bound.items()):
        return bound
    return None


def strip_conventional_imports(text: str) -> Stripped:
    """``text`` without its module-level import lines that bind only conventional names."""
    try:
        wrapper = MetadataWrapper(cst.parse_module(text), unsafe_skip_copy=True)
    except cst.ParserSyntaxError:
        return Stripped(text, (), "does not parse (a syntax-error fixture)")
    positions = wrapper.resolve(PositionProvider)
    module = wrapper.module
    lines: set[int] = set()
    names: set[str] = set()
    statements: set[cst.CSTNode] = set()
    for line in module.body:
        if not isinstance(line, cst.SimpleStatementLine):
            continue
        found = [conventional_bindings(s) if isinstance(s, (cst.Import, cst.ImportFrom)) else None for s in line.body]
        if found and all(bindings is not None for bindings in found):
            where = positions[line]
            lines.update(range(where.start.line, where.end.line + 1))
            names.update(name for bindings in found for name in bindings)
            statements.update(line.body)
    if not lines:
        return Stripped(text, ())
    reason = _meaning_would_change(wrapper, names, statements)
    if reason is not None:
        return Stripped(text, (), reason)
    kept = [line for number, line in enumerate(text.splitlines(keepends=True), 1) if number not in lines]
    return Stripped("".join(kept), tuple(sorted(lines)))


def _meaning_would_change(wrapper: MetadataWrapper, names: set[str], statements: set[cst.CSTNode]) -> str | None:
    """Why removing ``statements``, the imports of ``names``, would change what a name means, if it would:
    a star import (it makes unbound names unknown), or another binding of one of the names (it would then be bound
    where the import used to be, not conventional)."""
    module = wrapper.module
    if "import *" in module.code:
        return "a star import: without the imports, the conventional names would be unknown"
    scopes = set(wrapper.resolve(ScopeProvider).values())
    for scope in scopes:
        for name in names:
            for assignment in scope.assignments[name] if name in scope.assignments else ():
                node = getattr(assignment, "node", None)
                if node is not None and node not in statements:
                    return f"`{name}` is also bound by `{module.code_for_node(node).splitlines()[0].strip()}`"
    declared = re.compile(rf"\b(?:global|nonlocal)\s[^\n]*\b(?:{'|'.join(map(re.escape, names))})\b")
    if declared.search(module.code):
        return "a global/nonlocal declaration of a conventional name"
    return None


def new_line(line: int, removed: tuple[int, ...]) -> int | None:
    """Where ``line`` of the original lands once ``removed`` are taken out (None: it was removed)."""
    if line in removed:
        return None
    return line - sum(1 for r in removed if r < line)


# -- the fixtures, whole and stripped -------------------------------------------------------------


@cache
def stripped_fixtures() -> dict[str, Stripped]:
    """Relative path -> the stripped text, for every Python fixture (fixed ones included)."""
    paths = sorted(FIXTURES.rglob("*.py"))
    return {str(path.relative_to(FIXTURES)): strip_conventional_imports(path.read_text()) for path in paths}


def _findings(root: Path) -> dict[str, list[tuple[int | None, int, int, str]]]:
    """Every rule's findings (opt-in ones too) under ``root``: relative path -> (cell, line, column, code)."""
    result = run([str(root)], resolve_settings(None, root, select=("ALL",)), use_cache=False, jobs=1)
    assert result.internal_errors == []
    found: dict[str, list[tuple[int | None, int, int, str]]] = {}
    for finding in result.findings:
        relative = str(Path(finding.filename).resolve().relative_to(root.resolve()))
        found.setdefault(relative, []).append((finding.cell, finding.span.line, finding.span.column, finding.code))
    return found


@pytest.fixture(scope="module")
def both_runs(tmp_path_factory):
    """The findings on a copy of the fixtures, and on a copy whose Python files are stripped."""
    whole = tmp_path_factory.mktemp("whole") / "fixtures"
    bare = tmp_path_factory.mktemp("stripped") / "fixtures"
    shutil.copytree(FIXTURES, whole)
    shutil.copytree(FIXTURES, bare)
    for relative, stripped in stripped_fixtures().items():
        (bare / relative).write_text(stripped.text)
    return _findings(whole), _findings(bare), bare


def test_stripping_removes_imports_from_most_fixtures():
    """The comparison below is not vacuous: most Python fixtures lose imports, and those left whole say why."""
    stripped = stripped_fixtures()
    changed = [path for path, s in stripped.items() if s.removed]
    kept = {path: s.kept_because for path, s in stripped.items() if s.kept_because}
    print(f"\n{len(changed)} of {len(stripped)} Python fixtures stripped; left whole:")
    for path, reason in sorted(kept.items()):
        print(f"  {path}: {reason}")
    assert len(changed) > len(stripped) // 2
    assert all(reason for reason in kept.values())


def test_findings_without_conventional_imports_are_the_same(both_runs):
    whole, bare, _ = both_runs
    stripped = stripped_fixtures()
    differences = []
    for path in sorted(set(whole) | set(bare)):
        removed = stripped[path].removed if path in stripped else ()
        expected = sorted(
            (cell, new_line(line, removed) if cell is None else line, column, code)
            for cell, line, column, code in whole.get(path, [])
        )
        got = sorted(bare.get(path, []))
        if got != expected:
            differences.append(f"{path}: with the imports {expected}, without {got}")
    assert differences == [], "\n".join(differences)


def test_fixes_of_stripped_fixtures_are_the_same_and_valid(both_runs, tmp_path):
    """``--fix`` on the stripped fixtures changes the code as on the whole ones: the same files, the same lines
    but for imports (a fix may add an import the snippet lacks, or extend one the whole file has); what it writes
    parses, and every safe fix applies."""
    whole, bare = tmp_path / "whole" / "fixtures", tmp_path / "stripped" / "fixtures"
    shutil.copytree(FIXTURES, whole)
    shutil.copytree(both_runs[2], bare)
    _fix(whole)
    left = _fix(bare)
    assert left == []
    differences, unparsable = [], []
    for relative, stripped in stripped_fixtures().items():
        fixed_whole, fixed_bare = (whole / relative).read_text(), (bare / relative).read_text()
        if (fixed_whole != (FIXTURES / relative).read_text()) != (fixed_bare != stripped.text):
            differences.append(f"{relative}: fixed in one copy only")
        elif _code_lines(fixed_whole) != _code_lines(fixed_bare):
            differences.append(f"{relative}: {_code_lines(fixed_whole) ^ _code_lines(fixed_bare)}")
        try:
            cst.parse_module(fixed_bare)
        except cst.ParserSyntaxError as error:
            if stripped.kept_because is None:
                unparsable.append(f"{relative}: {error.message}")
    assert differences == [], "\n".join(differences)
    assert unparsable == []


def _fix(root: Path) -> list[str]:
    """Apply the safe fixes under ``root``; the safe fixes left."""
    result = run([str(root)], resolve_settings(None, root), mode="fix", use_cache=False, jobs=1)
    assert result.internal_errors == []
    safe = [f for f in result.findings if f.fix_applicability == Applicability.SAFE]
    return [f"{f.filename}:{f.span.line}: {f.code}" for f in safe]


def _code_lines(text: str) -> set[tuple[str, int]]:
    """The non-blank lines that are not imports, with how often each occurs."""
    lines = [line for line in text.splitlines() if line.strip() and not IMPORT_LINE.match(line)]
    return {(line, lines.count(line)) for line in set(lines)}


IMPORT_LINE = re.compile(r"\s*(?:import|from\s+\S+\s+import)\s")


# -- the helpers, on their own ------------------------------------------------------------------------


def test_strip_keeps_imports_of_other_meanings_and_lines_map():
    text = (
        "import torch\n"
        "import torch.distributed as dist\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "import mylib as F\n"
        "from accelerate import Accelerator\n"
        "dist.barrier()\n"
    )
    stripped = strip_conventional_imports(text)
    kept = "from torch.utils.data import DataLoader, TensorDataset\nimport mylib as F\ndist.barrier()\n"
    assert stripped.text == kept
    assert stripped.removed == (1, 2, 5)
    assert [new_line(line, stripped.removed) for line in (1, 3, 4, 6)] == [None, 1, 2, 3]


@pytest.mark.parametrize(
    "text",
    [
        "import torch.distributed as dist\nfrom helpers import *\ndist.barrier()\n",
        "import torch.distributed as dist\ndef f(dist):\n    dist.barrier()\n",
        "import torch.nn.functional as F\nF = None\n",
    ],
)
def test_strip_leaves_a_file_whole_where_meaning_would_change(text):
    stripped = strip_conventional_imports(text)
    assert stripped.text == text and stripped.removed == () and stripped.kept_because


# -- notebooks: the cells are one script, so an earlier cell's import binds the name -------------------------

GUARDED_BARRIER = "if dist.get_rank() == 0:\n    torch.save(state, path)\n    dist.barrier()\n"


def _notebook(*sources: str) -> str:
    cells = [{"cell_type": "code", "metadata": {}, "source": s.splitlines(keepends=True)} for s in sources]
    data = {"cells": cells, "metadata": {"language_info": {"name": "python"}}, "nbformat": 4, "nbformat_minor": 5}
    return json.dumps(data, indent=1) + "\n"


@pytest.mark.parametrize(
    ("first_cell", "expected"),
    [
        ("state = {}\n", [(2, 3, "LD405")]),  # no cell imports `dist`: it is torch.distributed
        ("import torch.distributed as dist\n", [(2, 3, "LD405")]),
        ("import mylib as dist\n", []),  # an earlier cell binds `dist` to something else: not a collective
    ],
)
def test_notebook_cells_see_earlier_cells_bindings(first_cell, expected, tmp_path, lintdist):
    path = tmp_path / "train.ipynb"
    path.write_text(_notebook(first_cell, GUARDED_BARRIER))
    result = lintdist("check", "--no-cache", "--select", "LD405", "--output-format", "json", str(path))
    assert [(f["cell"], f["line"], f["code"]) for f in json.loads(result.output)] == expected


def test_readme_names_every_conventional_name():
    readme = (FIXTURES.parent / "README.md").read_text()
    paragraph = readme[readme.index("- **conventional names**") :].split("\n\n", 1)[0]
    assert {name for name in CONVENTIONAL_NAMES if f"`{name}`" not in paragraph} == set()
