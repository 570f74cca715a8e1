"""Notebooks: code cells checked as one script, findings located by cell, fixes written back to the cells."""

from __future__ import annotations

import json

from lintdist.notebook import read_notebook, write_notebook


def _notebook(*sources: str, kinds=None) -> dict:
    kinds = kinds or ["code"] * len(sources)
    cells = [{"cell_type": k, "metadata": {}, "source": s.splitlines(keepends=True)} for k, s in zip(kinds, sources)]
    return {"cells": cells, "metadata": {"language_info": {"name": "python"}}, "nbformat": 4, "nbformat_minor": 5}


def test_magics_are_masked_and_restored_and_cells_round_trip():
    data = _notebook(
        "# Title",
        "%load_ext autoreload\nimport torch\n",
        "%%bash\necho hi\n",
        "x = 1\nfor i in y:\n    !ls\nlen?",
        kinds=["markdown", "code", "code", "code"],
    )
    text = json.dumps(data, indent=1, ensure_ascii=False) + "\n"
    notebook = read_notebook(text)
    import libcst

    libcst.parse_module(notebook.python)  # masked magics are valid Python
    assert notebook.location(notebook.python.splitlines().index("x = 1") + 1) == (4, 1)
    assert write_notebook(read_notebook(text), notebook.python) == text


def test_findings_are_located_by_cell_and_fixes_land_in_their_cell(tmp_path, lintdist):
    path = tmp_path / "train.ipynb"
    setup = "import torch\nfrom torch.utils.data import DataLoader, DistributedSampler\nloader = DataLoader(ds, sampler=DistributedSampler(ds))\n"
    loop = "for epoch in range(3):\n    for b in loader:\n        model(b).sum().backward()"
    path.write_text(json.dumps(_notebook(setup, "%matplotlib inline", loop), indent=1) + "\n")
    result = lintdist("check", "--no-cache", "--output-format", "json", str(path))
    [finding] = json.loads(result.output)
    assert (finding["cell"], finding["line"], finding["column"]) == (3, 1, 1)
    assert lintdist("check", "--no-cache", "--fix", str(path)).exit_code == 0
    cells = ["".join(c["source"]) for c in json.loads(path.read_text())["cells"]]
    # libcst's import insertion separates the import block from the code with a blank line
    assert cells[0] == setup.replace(
        "DistributedSampler\n", "DistributedSampler\nfrom lintdist.runtime import set_epoch\n\n"
    )
    assert cells[1] == "%matplotlib inline"
    assert cells[2] == loop.replace("range(3):\n", "range(3):\n    set_epoch(loader, epoch)\n")


def test_broken_notebook_json_is_reported(tmp_path, lintdist):
    (tmp_path / "bad.ipynb").write_text('{"cells": [')
    result = lintdist("check", "--no-cache", "--output-format", "concise", str(tmp_path / "bad.ipynb"))
    assert result.exit_code == 1 and "LD001 [error] invalid notebook JSON" in result.output
