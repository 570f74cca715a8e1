"""The accumulation window of a hand-written loop (lintdist/windows.py)."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.loop import TrainingLoop
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex
from lintdist.windows import (
    accumulation_gates,
    backward_window,
    gated_steps,
    last_iteration,
    loop_window,
    mentions_sync_control,
    reads_unsynced_gradients,
    single_step,
    steps_in,
    steps_outside,
    sync_managed,
    unstepped_tail,
)


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


GATED = """
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(net)
optimizer = torch.optim.SGD(params)


def forward_backward(batch):
    model(batch).backward()


for epoch in range(epochs):
    for i, batch in enumerate(loader):
        forward_backward(batch)
        if (i + 1) % accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
"""


def _backward(loop: TrainingLoop) -> cst.Call:
    return loop.backward_sites[0].call


def test_backward_window_through_a_helper():
    loop = _loop(GATED)
    window = backward_window(loop, _backward(loop), 1)
    assert _code(loop, window.anchor) == "forward_backward(batch)"
    assert window.helpers == (window.anchor,)
    assert _code(loop, window.gate.node.test) == "(i + 1) % accum_steps == 0"
    assert _code(loop, window.step.call) == "optimizer.step()"
    assert _code(loop, window.loop.iter) == "enumerate(loader)"
    assert window.inner is None
    assert backward_window(loop, _backward(loop), 0) is None  # the helper is not followed
    assert loop_window(loop, _backward(loop), 1) is None  # a gate, no accumulation loop


def test_backward_window_of_an_accumulation_loop():
    loop = _loop(
        """
        import torch
        optimizer = torch.optim.SGD(params)
        for it in range(iters):
            for micro in range(grad_accum_steps):
                model(next(batches)).backward()
            optimizer.step()
        """
    )
    window = backward_window(loop, _backward(loop), 2)
    assert window.gate is None
    assert _code(loop, window.inner.bound) == "grad_accum_steps"
    assert _code(loop, window.loop.iter) == "range(iters)"
    assert not unstepped_tail(loop, window)
    assert loop_window(loop, _backward(loop), 0) == window


def test_no_backward_window_when_another_optimizer_steps_every_batch():
    loop = _loop(
        """
        import torch
        d_opt = torch.optim.SGD(d_params)
        g_opt = torch.optim.SGD(g_params)
        for step, real in enumerate(loader):
            d_loss(real).backward()
            d_opt.step()
            g_loss(real).backward()
            if (step + 1) % accum_steps == 0:
                g_opt.step()
        """
    )
    assert [backward_window(loop, site.call, 2) for site in loop.backward_sites] == [None, None]


def test_steps_in_follows_local_helpers():
    loop = _loop(GATED)
    function = loop.facts.index.module.body[3]
    assert [_code(loop, s.call) for s in steps_in(loop, [loop.facts.index.module])] == ["optimizer.step()"]
    assert steps_in(loop, [function]) == []
    assert [_code(loop, s.call) for s in steps_in(loop, [loop.facts.index.module], "zero_grad")] == [
        "optimizer.zero_grad()"
    ]


def test_unstepped_tail_and_steps_outside_the_window():
    loop = _loop(GATED)
    window = backward_window(loop, _backward(loop), 1)
    assert unstepped_tail(loop, window)
    assert steps_outside(loop, window) == []
    tail = _loop(GATED + "    optimizer.step()\n")
    window = backward_window(tail, _backward(tail), 1)
    assert [_code(tail, s.call) for s in steps_outside(tail, window)] == ["optimizer.step()"]
    assert not unstepped_tail(tail, window)  # the step after the loop takes the last micro-batches
    counter = _loop(GATED.replace("(i + 1) % accum_steps", "(global_step + 1) % accum_steps"))
    assert not unstepped_tail(counter, backward_window(counter, _backward(counter), 1))


def test_sync_managed():
    loop = _loop(GATED)
    assert not sync_managed(loop, backward_window(loop, _backward(loop), 1), _backward(loop))
    for change in (
        ("    model(batch).backward()", "    with model.no_sync():\n        model(batch).backward()"),
        ("    model(batch).backward()", "    model.require_backward_grad_sync = last\n    model(batch).backward()"),
        ("    model(batch).backward()", "    model.module(batch).backward()"),
    ):
        managed = _loop(GATED.replace(*change))
        window = backward_window(managed, _backward(managed), 1)
        assert sync_managed(managed, window, _backward(managed)), change


def test_reads_unsynced_gradients_outside_the_gate():
    loop = _loop(GATED)
    assert not reads_unsynced_gradients(loop, backward_window(loop, _backward(loop), 1))
    inside = "            optimizer.step()"
    for read in ("torch.nn.utils.clip_grad_norm_(params, 1.0)", "log(params[0].grad)"):
        clean = _loop(GATED.replace(inside, f"            {read}\n{inside}"))
        assert not reads_unsynced_gradients(clean, backward_window(clean, _backward(clean), 1)), read
        outside = _loop(GATED.replace("        if (i + 1)", f"        {read}\n        if (i + 1)"))
        assert reads_unsynced_gradients(outside, backward_window(outside, _backward(outside), 1)), read
