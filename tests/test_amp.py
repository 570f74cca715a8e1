"""lintdist/amp.py: which deprecated mixed-precision API a callee names."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.amp import deprecated_amp
from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def test_deprecated_spellings_by_kind_and_device():
    index = SyntaxIndex(
        cst.parse_module(
            textwrap.dedent(
                """
                import torch
                from torch.cuda.amp import custom_fwd
                from torch.cpu import amp as cpu_amp
                from torch.amp import GradScaler
                torch.cuda.amp.autocast()
                torch.cuda.amp.grad_scaler.GradScaler()
                cpu_amp.autocast()
                custom_fwd(f)
                GradScaler("cuda")
                torch.autocast("cuda")
                torch.cuda.synchronize()
                """
            )
        )
    )
    facts = PythonFacts(index, NameResolver(index))
    assert [deprecated_amp(facts, call.func) for call in facts.calls] == [
        ("autocast", "cuda"),
        ("GradScaler", "cuda"),
        ("autocast", "cpu"),
        ("custom_fwd", "cuda"),
        None,
        None,
        None,
    ]
