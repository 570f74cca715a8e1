"""Shared helpers for the linter's tests."""

from __future__ import annotations

import os
import tempfile

import pytest
from click.testing import CliRunner

from lintdist.cli import cli

# `accelerate launch` lines without --config_file read the default accelerate config under $HF_HOME; the tests
# must not depend on the one this machine may have.
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="lintdist-tests-hf-home-")


@pytest.fixture
def lintdist(monkeypatch):
    """Run the CLI in-process: ``lintdist("check", "x.py")`` -> click Result (exit_code, stdout, stderr)."""

    def invoke(*args: str, cwd=None):
        if cwd is not None:
            monkeypatch.chdir(cwd)
        return CliRunner().invoke(cli, list(args), catch_exceptions=False)

    return invoke
