"""Shared helpers for the linter's tests."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from lintdist.cli import cli


@pytest.fixture
def lintdist(monkeypatch):
    """Run the CLI in-process: ``lintdist("check", "x.py")`` -> click Result (exit_code, stdout, stderr)."""

    def invoke(*args: str, cwd=None):
        if cwd is not None:
            monkeypatch.chdir(cwd)
        return CliRunner().invoke(cli, list(args), catch_exceptions=False)

    return invoke
