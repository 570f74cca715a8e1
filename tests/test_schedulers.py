"""Which call builds an LR scheduler, its length, warmup and schedule function (lintdist/schedulers.py)."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.schedulers import (
    schedule_function,
    scheduler_class,
    scheduler_length,
    scheduler_steps,
    scheduler_warmup,
)
from lintdist.syntax import SyntaxIndex


def _facts(source: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(source)))
    return PythonFacts(index, NameResolver(index))


def _schedulers(facts: PythonFacts) -> list[tuple[cst.Call, str]]:
    return [(c, q) for c in facts.calls if (q := scheduler_class(facts, c)) is not None]


def test_lengths_and_warmups_by_keyword_or_position():
    facts = _facts(
        """
        import torch
        from transformers import get_scheduler, get_linear_schedule_with_warmup
        from diffusers.optimization import get_scheduler as diffusers_scheduler

        a = get_scheduler("linear", optimizer, 10, total)
        b = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=5, num_training_steps=n)
        c = diffusers_scheduler(name, optimizer, None, 7, steps)
        d = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)
        e = torch.optim.lr_scheduler.OneCycleLR(optimizer, 0.1, epochs=3, steps_per_epoch=len(loader))
        f = get_scheduler("constant", optimizer, 10, total)
        g = torch.optim.lr_scheduler.StepLR(optimizer, 30)
        """
    )
    code = facts.index.module.code_for_node
    found = []
    for call, qualified in _schedulers(facts):
        length = scheduler_length(call, qualified)
        warmup = scheduler_warmup(call, qualified)
        found.append(
            (
                qualified.rsplit(".", 1)[-1],
                None if length is None else (length[0], code(length[1])),
                None if warmup is None else code(warmup),
            )
        )
    assert found == [
        ("get_scheduler", ("num_training_steps", "total"), "10"),
        ("get_linear_schedule_with_warmup", ("num_training_steps", "n"), "5"),
        ("get_scheduler", ("num_training_steps", "steps"), "7"),
        ("CosineAnnealingLR", ("T_max", "epochs"), None),
        ("OneCycleLR", ("steps_per_epoch", "len(loader)"), None),
        ("get_scheduler", None, "10"),
    ]


def test_the_schedule_function_of_lambda_lr():
    facts = _facts(
        """
        from torch.optim.lr_scheduler import LambdaLR

        def decay(step):
            return 1 - step / total

        inline = LambdaLR(optimizer, lambda step: step / warmup)
        named = LambdaLR(optimizer, lr_lambda=decay)
        bound = LambdaLR(optimizer, schedule)
        schedule = lambda step: 1.0
        """
    )
    found = [schedule_function(facts, call) for call, _ in _schedulers(facts)]
    assert isinstance(found[0], cst.Lambda)
    assert isinstance(found[1], cst.FunctionDef) and found[1].name.value == "decay"
    assert isinstance(found[2], cst.Lambda)  # the lambda the name is bound to


def test_scheduler_steps_by_name_or_by_a_name_that_says_scheduler():
    facts = _facts(
        """
        lr_scheduler.step()
        optimizer.step()
        self.sched.step()
        """
    )
    code = facts.index.module.code_for_node
    assert [code(c) for c in scheduler_steps(facts, {"lr_scheduler"})] == ["lr_scheduler.step()"]
    assert [code(c) for c in scheduler_steps(facts, {"scheduler"})] == ["lr_scheduler.step()", "self.sched.step()"]
