"""lintdist/optimizers.py: which calls build a torch optimizer, and whether the script steps it."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.optimizers import optimizer_class, stepped
from lintdist.syntax import SyntaxIndex


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


SOURCE = """
import torch
from torch import optim
from accelerate import Accelerator
accelerator = Accelerator()
direct = torch.optim.SGD(params, lr=0.1)
prepared = optim.AdamW(params, lr=1e-3)
idle = torch.optim.Adam(params)
custom = Lion(params)
model, prepared_opt = accelerator.prepare(model, prepared)
direct.step()
prepared_opt.step()
"""


def _built(facts: PythonFacts, target: str) -> cst.Call:
    return next(
        c
        for c in facts.calls
        if isinstance(facts.parent(c), cst.Assign) and facts.parent(c).targets[0].target.value == target
    )


def test_the_optimizer_class_a_call_builds():
    facts = _facts(SOURCE)
    assert optimizer_class(facts, _built(facts, "direct")) == "SGD"
    assert optimizer_class(facts, _built(facts, "prepared")) == "AdamW"
    assert optimizer_class(facts, _built(facts, "custom")) is None


def test_stepped_directly_or_through_prepare():
    facts = _facts(SOURCE)
    assert stepped(facts, _built(facts, "direct"))
    assert stepped(facts, _built(facts, "prepared"))
    assert not stepped(facts, _built(facts, "idle"))
