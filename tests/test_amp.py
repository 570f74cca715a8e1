"""lintdist/amp.py: which deprecated mixed-precision API a callee names."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.amp import deprecated_amp, torch_amp_import
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


def test_torch_amp_import_moves_the_deprecated_modules_only():
    def moved(source: str):
        found = torch_amp_import(cst.parse_statement(source).body[0])
        return None if found is None else (cst.Module([]).code_for_node(found[0]), found[1])

    assert moved("from torch.cuda.amp import autocast, GradScaler\n") == (
        "from torch.amp import autocast, GradScaler",
        False,
    )
    assert moved("from torch.cpu.amp.autocast_mode import autocast\n") == ("from torch.amp import autocast", False)
    assert moved("from torch.cuda import amp\n") == ("from torch import amp", True)
    assert moved("import torch.cuda.amp as amp\n") == ("import torch.amp as amp", True)
    assert moved("from torch.cuda.amp import autocast, common\n") is None  # a name torch.amp lacks
    assert moved("import torch.cuda.amp\n") is None  # binds `torch`, read for more than amp
    assert moved("from torch.cuda import amp, synchronize\n") is None
    assert moved("from .amp import autocast\n") is None
