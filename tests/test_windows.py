"""The accumulation window of a hand-written loop (lintdist/windows.py)."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.loop import TrainingLoop
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex
from lintdist.windows import accumulation_gates, gated_steps, last_iteration, mentions_sync_control, single_step


def _loop(source: str) -> TrainingLoop:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(source)))
    return TrainingLoop(PythonFacts(index, NameResolver(index)))


def _code(loop: TrainingLoop, node: cst.CSTNode) -> str:
    return loop.facts.index.module.code_for_node(node)


SOURCE = """
import torch

optimizer = torch.optim.AdamW(params)
ACCUM_ONE = 1


def apply():
    optimizer.step()


for step, batch in enumerate(loader):
    model(batch).backward()
    if (step + 1) % accum_steps == 0:
        apply()
    if step % ACCUM_ONE == 0:
        optimizer.step()
    if step > 10:
        optimizer.step()
"""


def test_accumulation_gates_through_callers():
    loop = _loop(SOURCE)
    in_helper = loop.steps[0]
    assert in_helper.kind == "optimizer"
    assert [_code(loop, g.node.test) for g in accumulation_gates(loop, in_helper.call, 1)] == [
        "(step + 1) % accum_steps == 0"
    ]
    assert accumulation_gates(loop, in_helper.call, 0) == []
    plain = [s for s in loop.steps if s.kind == "optimizer"][-1]
    assert accumulation_gates(loop, plain.call, 2) == []  # `if step > 10:` is no accumulation gate


def test_gated_steps_skip_single_step_gates():
    loop = _loop(SOURCE)
    gates = [g for _, g in gated_steps(loop, 2)]
    assert [_code(loop, g.node.test) for g in gates] == ["(step + 1) % accum_steps == 0"]
    single = [g for s in loop.steps for g in accumulation_gates(loop, s.call, 0)]
    assert [single_step(loop, g) for g in single] == [True]


def test_last_iteration_of_a_micro_step_loop():
    loop = _loop(
        """
        import torch
        optimizer = torch.optim.SGD(params)
        for it in range(iters):
            for micro in range(grad_accum_steps):
                loss = model(next(batches))
                loss.backward()
            optimizer.step()
        """
    )
    window = loop.accumulation_loop(loop.backward_sites[0].call)
    assert _code(loop, last_iteration(loop, window)) == "micro == grad_accum_steps - 1"


def test_no_last_iteration_when_the_loop_can_stop_early_or_rebinds():
    for body in ("if bad: break", "grad_accum_steps = 2", "micro += 1"):
        loop = _loop(
            f"""
            import torch
            optimizer = torch.optim.SGD(params)
            for it in range(iters):
                for micro in range(grad_accum_steps):
                    {body}
                    model(x).backward()
                optimizer.step()
            """
        )
        window = loop.accumulation_loop(loop.backward_sites[0].call)
        assert last_iteration(loop, window) is None, body


def test_mentions_sync_control():
    loop = _loop("with model.no_sync():\n    pass\nmodel.require_backward_grad_sync = last\nother()\n")
    statements = loop.facts.index.module.body
    assert mentions_sync_control(loop, statements[0])
    assert mentions_sync_control(loop, statements[1])
    assert not mentions_sync_control(loop, statements[2])
