"""IPython's input syntax in notebooks, with IPython's own input transformer as the oracle.

lintdist masks the lines IPython rewrites (magics, shell escapes and their backslash continuations, help
queries, auto-calls, `x = !cmd`) so that a cell parses as Python with every line in place. For every cell here,
and for every code cell of the public notebooks under /work/corpus when that folder exists:

- the masked text has the cell's lines, one for one, and restores to the cell byte for byte;
- it parses with libcst exactly when IPython's transformed cell parses with `ast`;
- the lines it masks are the lines IPython rewrites (found by aligning the cell with IPython's output).

IPython is a test dependency only; lintdist does not import it.
"""

from __future__ import annotations

import ast
import difflib
import json
from pathlib import Path

import libcst as cst
import pytest

from lintdist.notebook import _mask, read_notebook, write_notebook
from lintdist.sources import SourceError

pytest.importorskip("IPython", reason="IPython (a test dependency) is the oracle for notebook syntax")
from IPython.core.inputtransformer2 import TransformerManager

CORPUS = Path("/work/corpus")

CELLS = [
    "%matplotlib inline\nimport torch\n",
    "%time total = sum(range(10))\nprint(total)\n",
    "!pip install -q -U \\\n    transformers \\\n    accelerate\nimport accelerate\n",
    "! python prepare.py --data_dir data/raw \\\n                   --split train \\\n                   --out data\n",
    "!!ls -la\n",
    "files = !ls *.py\nprint(files)\n",
    "elapsed = %timeit -o sum(range(5))\n",
    "torch.nn.Linear?\n",
    "??torch.optim.AdamW\n",
    "%pinfo torch.tensor\n",
    "len??\n",
    "/print 1\n",
    ",print a b\n",
    ";print a b\n",
    "for name in ['a', 'b']:\n    !echo {name}\n    %time print(name)\n",
    "if True:\n    !pip install \\\n        peft\n    x = 1\n",
    "%%bash\necho hi\nls -la\n",
    "%%capture\n!pip install datasets\n",
    "\n\n%%writefile train.py\nimport torch\nprint(torch.__version__)\n",
    "%%time\nx = [i for i in range(3)]\n",
    "text = '''\n!not a shell escape\n%not a magic\n'''\n",
    "values = [\n    1,\n    2,\n]\nprint(values)\n",
    "note = 'a ! and a % inside a string'  # and a ? in a comment\n",
    "total = 1 + \\\n    2\n",
    "args = dict(\n    lr=1e-3,\n    steps=10\n    warmup=2,\n)\n",  # a real missing comma
    "x = 1\nx == 1\n",
    "d = {'a': 1}\nd['a'] != 2\n",
    "%load_ext autoreload\n%autoreload 2\n",
    "!accelerate launch train.py \\\n  --mixed_precision=fp16 \\\n  --gradient_accumulation_steps=4\n",
    "x = 1; y = 2\n",
    "print('unterminated \\\n  continued string')\n",
]


def _rewritten_by_ipython(cell: str) -> set[int]:
    """0-based numbers of the non-blank lines of ``cell`` that IPython's transformer does not keep as they are."""
    original = [line.rstrip("\r\n") for line in cell.splitlines()]
    transformed = [line.rstrip("\n") for line in TransformerManager().transform_cell(cell).splitlines()]
    kept: set[int] = set()
    matcher = difflib.SequenceMatcher(None, original, transformed, autojunk=False)
    for tag, i1, i2, _, _ in matcher.get_opcodes():
        if tag == "equal":
            kept.update(range(i1, i2))
    return {i for i, line in enumerate(original) if line.strip() and i not in kept}


def _masked_lines(cell: str, masked: str) -> set[int]:
    return {
        i
        for i, (before, after) in enumerate(zip(cell.splitlines(), masked.splitlines()))
        if before != after and before.strip()
    }


def _parses_libcst(text: str) -> bool:
    try:
        cst.parse_module(text)
    except cst.ParserSyntaxError:
        return False
    return True


def _parses_ipython(cell: str) -> bool:
    try:
        ast.parse(TransformerManager().transform_cell(cell))
    except SyntaxError:
        return False
    return True


def _indented_as_a_whole(cell: str) -> bool:
    """IPython dedents a cell whose every line is indented; lintdist keeps the cell as written."""
    lines = [line for line in cell.splitlines() if line.strip()]
    return bool(lines) and all(line[:1] in (" ", "\t") for line in lines)


def _differences(cell: str) -> list[str]:
    masked = _mask(cell)
    problems = []
    if masked.count("\n") != cell.count("\n") or len(masked.splitlines()) != len(cell.splitlines()):
        problems.append("line count changed")
    if _indented_as_a_whole(cell):
        return problems
    if _parses_libcst(masked) != _parses_ipython(cell):
        problems.append(f"parses: lintdist {_parses_libcst(masked)}, IPython {_parses_ipython(cell)}")
    if _masked_lines(cell, masked) != _rewritten_by_ipython(cell):
        problems.append(f"masked {sorted(_masked_lines(cell, masked))}, IPython {sorted(_rewritten_by_ipython(cell))}")
    return problems


def _round_trip(cells: list[str]) -> None:
    data = {
        "cells": [{"cell_type": "code", "metadata": {}, "source": c.splitlines(keepends=True)} for c in cells],
        "metadata": {"language_info": {"name": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    text = json.dumps(data, indent=1, ensure_ascii=False) + "\n"
    notebook = read_notebook(text)
    assert write_notebook(read_notebook(text), notebook.python) == text


@pytest.mark.parametrize("cell", CELLS, ids=range(len(CELLS)))
def test_cell_is_masked_as_ipython_reads_it(cell):
    assert _differences(cell) == []
    _round_trip([cell])


def test_the_oracle_sees_what_lintdist_masks():
    # the comparison can fail: a cell whose escape lintdist would leave alone, and one it would wrongly mask
    assert _rewritten_by_ipython("!ls\nx = 1\n") == {0}
    assert _rewritten_by_ipython("x = '''\n!ls\n'''\n") == set()
    assert not _parses_ipython("args = dict(\n    a=1\n    b=2,\n)\n")


def test_a_fix_reindenting_a_continued_escape_restores_the_continuation_as_written():
    cell = "!pip install \\\n    peft\nx = 1\n"
    notebook = read_notebook(
        json.dumps({"cells": [{"cell_type": "code", "metadata": {}, "source": cell}], "metadata": {}}, indent=1)
    )
    shifted = "".join(
        "    " + line if "lintdist-" in line and "cell" not in line else line
        for line in notebook.python.splitlines(keepends=True)
    )
    restored = json.loads(write_notebook(notebook, shifted))["cells"][0]["source"]
    assert restored == "    !pip install \\\n    peft\nx = 1\n"  # a string source stays a string


def _public_cells() -> list[tuple[str, str]]:
    cells = []
    for path in sorted(CORPUS.rglob("*.ipynb")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            continue
        for index, cell in enumerate(data.get("cells", [])):
            if cell.get("cell_type") == "code":
                source = cell.get("source", "")
                cells.append(
                    (f"{path.relative_to(CORPUS)}#{index + 1}", "".join(source) if isinstance(source, list) else source)
                )
    return cells


@pytest.mark.skipif(not CORPUS.is_dir(), reason="the public notebooks live in /work/corpus, outside the repository")
def test_every_public_notebook_cell_is_masked_as_ipython_reads_it():
    cells = _public_cells()
    differences = {name: problems for name, cell in cells if (problems := _differences(cell))}
    print(f"{len(cells)} public code cells compared with IPython's transformer, {len(differences)} differ")
    assert differences == {}


@pytest.mark.skipif(not CORPUS.is_dir(), reason="the public notebooks live in /work/corpus, outside the repository")
def test_public_notebooks_round_trip_byte_for_byte():
    checked = 0
    for path in sorted(CORPUS.rglob("*.ipynb")):
        text = path.read_text(encoding="utf-8")
        try:
            notebook = read_notebook(text)
        except SourceError as error:  # not a Python notebook: reported as LD001, never rewritten
            print(f"{path}: {error}")
            continue
        assert json.loads(write_notebook(notebook, notebook.python)) == json.loads(text), path
        checked += 1
    print(f"{checked} public notebooks round-trip")
    assert checked > 0


def _notebook_file(tmp_path: Path, *cells: str) -> Path:
    path = tmp_path / "train.ipynb"
    data = {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": 3,
                "metadata": {"id": "x"},
                "outputs": [{"output_type": "stream", "name": "stdout", "text": ["ok\n"]}],
                "source": c.splitlines(keepends=True),
            }
            for c in cells
        ],
        "metadata": {"language_info": {"name": "python"}, "colab": {"provenance": []}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def test_continued_shell_escapes_get_no_syntax_error_and_a_real_one_still_does(tmp_path, lintdist):
    install = "!pip install -q -U \\\n    accelerate \\\n    datasets\n"
    launch = "! python preprocess.py --data_dir raw \\\n                        --output_dir data\n"
    train = "from datasets import load_dataset\nfrom accelerate import Accelerator\naccelerator = Accelerator()\nraw = load_dataset('imdb').map(len)\n"
    path = _notebook_file(tmp_path, install, launch, train)
    found = json.loads(lintdist("check", "--no-cache", "--output-format", "json", str(path)).output)
    assert [f["code"] for f in found] == ["LD401"]
    broken = _notebook_file(tmp_path, install, "config = dict(\n    lr=1e-4\n    epochs=3,\n)\n", train)
    found = json.loads(lintdist("check", "--no-cache", "--output-format", "json", str(broken)).output)
    assert [(f["code"], f["cell"]) for f in found] == [("LD001", 2)]


def test_fix_leaves_outputs_metadata_and_magics_untouched(tmp_path, lintdist):
    install = "!pip install -q -U \\\n    datasets\n%time x = 1\n"
    train = "from datasets import load_dataset\nfrom accelerate import Accelerator\naccelerator = Accelerator()\nraw = load_dataset('imdb').map(len)\n"
    path = _notebook_file(tmp_path, install, train)
    before = json.loads(path.read_text())
    lintdist("check", "--no-cache", "--fix", str(path))
    after = json.loads(path.read_text())
    assert after["metadata"] == before["metadata"]
    for old, new in zip(before["cells"], after["cells"]):
        assert {k: v for k, v in old.items() if k != "source"} == {k: v for k, v in new.items() if k != "source"}
    assert after["cells"][0]["source"] == before["cells"][0]["source"]
    assert "".join(after["cells"][1]["source"]).endswith(
        "with accelerator.main_process_first():\n    raw = load_dataset('imdb').map(len)\n"
    )
