"""What goes into an ``Accelerator.prepare`` call (``lintdist.object_kinds``)."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.loop import TrainingLoop
from lintdist.names import NameResolver
from lintdist.object_kinds import ObjectKinds
from lintdist.syntax import SyntaxIndex


def _kinds(source: str) -> list[str | None]:
    """The kind of each positional argument of the file's last ``prepare`` call."""
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(source)))
    kinds = ObjectKinds(TrainingLoop(PythonFacts(index, NameResolver(index))))
    call = [c for c in kinds.facts.calls if kinds.facts.method_name(c) == "prepare"][-1]
    return [kinds.kind(arg.value, call) for arg in call.args]


def test_names_decide_first():
    assert _kinds("accelerator.prepare(model, optimizer, train_loader, lr_scheduler, model_name)") == [
        "model",
        "optimizer",
        "other",
        "other",
        None,
    ]


def test_where_a_value_was_built():
    source = """\
    import torch
    from transformers import AutoModelForCausalLM
    from torch.utils.data import DataLoader
    a = AutoModelForCausalLM.from_pretrained("x").to("cuda")
    b = torch.optim.AdamW(a.parameters())
    c = DataLoader(data)
    d = torch.nn.functional.relu
    accelerator.prepare(a, b, c, d)
    """
    assert _kinds(source) == ["model", "optimizer", "other", None]


def test_own_module_classes_and_earlier_prepares():
    source = """\
    import torch
    class Net(torch.nn.Module):
        pass
    x = Net()
    y, = accelerator.prepare(x)
    accelerator.prepare(y)
    """
    assert _kinds(source) == ["model"]
