"""Bad input never stops the run; fixes keep encoding, BOM, line endings and mode; the cache and workers."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from test_cli import BROKEN, CLEAN


def _json(result):
    return json.loads(result.output)


def test_bad_inputs_are_reported_and_the_run_goes_on(tmp_path, lintdist, monkeypatch):
    (tmp_path / "syntax.py").write_text("from torch.utils.data import DistributedSampler\ndef f(:\n    pass\n")
    (tmp_path / "latin1.py").write_bytes("import torch\n# Gr\xfc\xdfe\n".encode("latin-1"))
    (tmp_path / "binary.py").write_bytes(b"\x00\x01torch\x00")
    (tmp_path / "locked.py").write_text(BROKEN)
    (tmp_path / "broken.yaml").write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: [FSDP\n")
    (tmp_path / "train.py").write_text(BROKEN)
    real_read = Path.read_bytes

    def read_bytes(self):
        if self.name == "locked.py":
            raise PermissionError(13, "Permission denied")
        return real_read(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    result = lintdist("check", "--output-format", "json", "--no-cache", str(tmp_path))
    assert result.exit_code == 1
    found = {Path(f["filename"]).name: (f["code"], f["line"], f["message"]) for f in _json(result)}
    assert found["syntax.py"][:2] == ("LD001", 2)
    assert found["latin1.py"][0] == "LD001" and "cannot decode as utf-8" in found["latin1.py"][2]
    assert found["binary.py"][0] == "LD001" and "binary" in found["binary.py"][2]
    assert found["locked.py"] == ("LD002", 1, "cannot read file: Permission denied")
    assert found["broken.yaml"][:2] == ("LD001", 3) and "invalid YAML" in found["broken.yaml"][2]
    assert found["train.py"][0] == "LD201", "the other files are still checked"


def test_syntax_errors_are_reported_where_a_rule_could_fire_or_the_file_is_named(tmp_path, lintdist):
    # lintdist checks training code, not syntax: a file no enabled rule can fire on is not even parsed ...
    (tmp_path / "utils.py").write_text("import torch\ndef f(:\n    pass\n")
    (tmp_path / "train.py").write_text("from torch.utils.data import DistributedSampler\ndef f(:\n    pass\n")
    result = lintdist("check", "--output-format", "json", "--no-cache", str(tmp_path))
    assert [(Path(f["filename"]).name, f["code"], f["line"]) for f in _json(result)] == [("train.py", "LD001", 2)]
    # ... unless it is named on the command line
    result = lintdist("check", "--output-format", "json", "--no-cache", str(tmp_path / "utils.py"))
    assert [(f["code"], f["line"]) for f in _json(result)] == [("LD001", 2)]


def test_latin1_with_a_coding_cookie_is_fine(tmp_path, lintdist):
    path = tmp_path / "cookie.py"
    path.write_bytes(("# -*- coding: latin-1 -*-\n# Gr\xfc\xdfe\n" + BROKEN).encode("latin-1"))
    result = lintdist("check", "--fix", "--no-cache", str(path))
    assert result.exit_code == 0
    assert path.read_bytes() == ("# -*- coding: latin-1 -*-\n# Gr\xfc\xdfe\n" + CLEAN).encode("latin-1")


def test_directory_loop_is_reported_once(tmp_path, lintdist):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text(BROKEN)
    os.symlink(tmp_path / "pkg", tmp_path / "pkg" / "again")
    result = lintdist("check", "--output-format", "json", "--no-cache", str(tmp_path))
    codes = sorted((f["code"], Path(f["filename"]).name) for f in _json(result))
    assert codes == [("LD002", "again"), ("LD201", "train.py")]


def test_fix_keeps_bom_crlf_and_mode(tmp_path, lintdist):
    path = tmp_path / "train.py"
    path.write_bytes(b"\xef\xbb\xbf" + BROKEN.replace("\n", "\r\n").encode())
    path.chmod(0o750)
    assert lintdist("check", "--fix", "--no-cache", str(path)).exit_code == 0
    assert path.read_bytes() == b"\xef\xbb\xbf" + CLEAN.replace("\n", "\r\n").encode()
    assert stat.S_IMODE(path.stat().st_mode) == 0o750


def test_helper_import_is_added_once(tmp_path, lintdist):
    source = '''\
"""Two trainings with inline samplers."""
import torch
from torch.utils.data import DataLoader, DistributedSampler

a = DataLoader(ds, sampler=DistributedSampler(ds))
b = DataLoader(ds, sampler=DistributedSampler(ds))
for epoch in range(2):
    for x in a:
        model(x).sum().backward()
for epoch in range(2):
    for x in b:
        model(x).sum().backward()
'''
    path = tmp_path / "two.py"
    path.write_text(source)
    assert lintdist("check", "--fix", "--no-cache", str(path)).exit_code == 0
    text = path.read_text()
    assert text.count("from lintdist.runtime import set_epoch") == 1
    assert text.index('"""Two trainings') == 0, "the import goes after the docstring"
    assert "set_epoch(a, epoch)" in text and "set_epoch(b, epoch)" in text


def test_cache_is_used_and_invalidated(tmp_path, lintdist, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(BROKEN)
    first = lintdist("check", "--output-format", "json", ".")
    assert (tmp_path / ".lintdist_cache" / ".gitignore").exists()

    from lintdist import runner

    calls = []
    real_process = runner.process
    monkeypatch.setattr(runner, "process", lambda task: calls.append(task) or real_process(task))
    second = lintdist("check", "--output-format", "json", ".")
    assert second.output == first.output and calls == [], "an unchanged file is served from the cache"

    (tmp_path / "train.py").write_text(CLEAN)
    assert lintdist("check", ".").exit_code == 0 and len(calls) == 1, "a changed file is checked again"
    assert lintdist("check", "--select", "LD0", ".").exit_code == 0 and len(calls) == 2, "other settings, other entry"


def test_no_cache_writes_no_cache(tmp_path, lintdist, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(BROKEN)
    lintdist("check", "--no-cache", ".")
    assert not (tmp_path / ".lintdist_cache").exists()


def test_parallel_jobs_give_the_same_deterministic_output(tmp_path, lintdist):
    for index in range(12):
        (tmp_path / f"train_{index:02}.py").write_text(BROKEN if index % 2 else CLEAN)
    one = lintdist("check", "--no-cache", "--jobs", "1", "--output-format", "json", str(tmp_path))
    two = lintdist("check", "--no-cache", "--jobs", "2", "--output-format", "json", str(tmp_path))
    assert one.output == two.output
    names = [Path(f["filename"]).name for f in _json(two)]
    assert names == sorted(names) and len(names) == 6


@pytest.mark.parametrize("name", ["launch.sh", "accelerate_config.yaml", "ds_config.json"])
def test_configs_and_launch_files_are_discovered(tmp_path, name):
    from lintdist.config import resolve_settings
    from lintdist.discover import discover

    (tmp_path / name).write_text("x")
    (tmp_path / "notes.txt").write_text("x")
    candidates, _ = discover([str(tmp_path)], resolve_settings(None, tmp_path))
    assert [c.path.name for c in candidates] == [name]
