"""The accumulation window of a hand-written loop: the gates an optimizer step runs under (also through the
helpers that run it), whether a gate accumulates one step only, the condition that holds on a window's last
micro-batch, and whether code already manages gradient synchronisation itself.

Built on ``lintdist.loop.TrainingLoop`` (steps, gates, ``for micro_step in range(accum_steps)`` windows).
"""

from __future__ import annotations

import libcst as cst

from lintdist.bindings import BINDERS, bound_names, read_names, repeatable
from lintdist.loop import AccumulationLoop, Gate, StepSite, TrainingLoop, integer_literal, is_accumulation_name

ACCUMULATION_GATES = frozenset({"modulo", "counter"})
# What turns a wrapper's gradient all-reduce off or on, however it is spelled.
SYNC_CONTROLS = frozenset(
    {"no_sync", "require_backward_grad_sync", "set_requires_gradient_sync", "no_backward_sync", "grad_sync"}
)


def accumulation_gates(loop: TrainingLoop, node: cst.CSTNode, depth: int) -> list[Gate]:
    """The accumulation gates (modulo or counter) ``node`` runs under: the innermost gate of its function, else
    those around the calls of its function, up to ``depth`` levels of callers."""
    gate = loop.gate_of(node)
    if gate is not None:
        return [gate] if gate.kind in ACCUMULATION_GATES else []
    function = loop.facts.enclosing_function(node)
    if function is None or depth <= 0:
        return []
    return [g for call in loop.facts.call_sites(function) for g in accumulation_gates(loop, call, depth - 1)]


def single_step(loop: TrainingLoop, gate: Gate) -> bool:
    """Whether a gate accumulates exactly one step: ``% 1``, or a steps name bound to the literal 1."""
    facts = loop.facts
    for node in facts.within(gate.node.test, cst.BinaryOperation, cst.Name, cst.Attribute):
        if isinstance(node, cst.BinaryOperation):
            if isinstance(node.operator, cst.Modulo) and integer_literal(node.right, facts, node) == 1:
                return True
        elif is_accumulation_name(node) and integer_literal(node, facts, node) == 1:
            return True
    return False


def gated_steps(loop: TrainingLoop, depth: int) -> list[tuple[StepSite, Gate]]:
    """Optimizer steps under an accumulation gate of more than one step, each with its gate (through up to
    ``depth`` levels of callers)."""
    return [
        (step, gate)
        for step in loop.steps
        if step.kind == "optimizer"
        for gate in accumulation_gates(loop, step.call, depth)
        if not single_step(loop, gate)
    ]


def last_iteration(loop: TrainingLoop, window: AccumulationLoop) -> cst.BaseExpression | None:
    """``micro_step == accum_steps - 1`` for ``for micro_step in range(accum_steps):``, when the loop runs every
    iteration to its end (no break, continue, return, raise or yield) and rebinds neither name; else None."""
    facts = loop.facts
    inner, bound = window.node, window.bound
    if not isinstance(inner.target, cst.Name) or not repeatable(facts, bound):
        return None
    if facts.within(inner.body, cst.Break, cst.Continue, cst.Return, cst.Raise, cst.Yield):
        return None
    names = read_names(facts, bound) | {inner.target.value}
    if any(bound_names(facts, node) & names for node in facts.within(inner.body, *BINDERS)):
        return None
    text = facts.index.module.code_for_node(bound)
    if not isinstance(bound, (cst.Name, cst.Attribute, cst.Integer, cst.Call, cst.Subscript)):
        text = f"({text})"
    return cst.parse_expression(f"{inner.target.value} == {text} - 1")


def mentions_sync_control(loop: TrainingLoop, container: cst.CSTNode) -> bool:
    """Whether ``container`` names a control of gradient synchronisation (``no_sync``, ``grad_sync``,
    ``require_backward_grad_sync``...): the code there manages when gradients are reduced."""
    for node in loop.facts.within(container, cst.Attribute, cst.Name):
        name = node.attr.value if isinstance(node, cst.Attribute) else node.value
        if name in SYNC_CONTROLS:
            return True
    return False
