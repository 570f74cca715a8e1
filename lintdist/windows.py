"""The accumulation window of a hand-written loop: the gates an optimizer step runs under (also through the
helpers that run it), whether a gate accumulates one step only, the condition that holds on a window's last
micro-batch, and whether code already manages gradient synchronisation itself.

Built on ``lintdist.loop.TrainingLoop`` (steps, gates, ``for micro_step in range(accum_steps)`` windows). A
backward pass's ``Window`` pairs it with the step that closes its window, and answers what else runs around it:
steps outside the window, a last partial window never stepped, gradients read before the sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from lintdist.bindings import BINDERS, bound_names, read_names, repeatable
from lintdist.control import called_in_loop, caller_chains, common_loop, loop_iterable
from lintdist.loop import AccumulationLoop, Gate, StepSite, TrainingLoop, integer_literal, is_accumulation_name
from lintdist.wrappers import inner_module_forwards

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


@dataclass(frozen=True)
class Window:
    """The accumulation window a backward pass feeds. ``anchor`` is the node of the window's function that runs the
    backward: the backward call itself, or the call of the helper that runs it (``helpers``: the helper calls from
    ``anchor`` down to the backward's function). ``step`` is the optimizer step that closes the window, under
    ``gate``, or, when ``gate`` is None, after the accumulation loop ``inner``; ``loop`` is the loop around both in
    the window's function (None: its callers run it once per micro-batch)."""

    anchor: cst.CSTNode
    helpers: tuple[cst.Call, ...]
    step: StepSite
    gate: Gate | None
    loop: cst.For | cst.While | None
    inner: AccumulationLoop | None = None


def steps_in(loop: TrainingLoop, scopes: list[cst.CSTNode], kind: str = "optimizer") -> list[StepSite]:
    """The steps of ``kind`` (see ``StepSite``) that the code of ``scopes`` runs, also inside the local functions it
    calls."""
    reached = {id(call) for scope in scopes for call in loop.facts.reachable_calls(scope)}
    return [step for step in loop.steps if step.kind == kind and id(step.call) in reached]


def backward_window(loop: TrainingLoop, backward: cst.Call, depth: int) -> Window | None:
    """The accumulation window the backward call ``backward`` feeds, through up to ``depth`` levels of helpers
    between the window and the backward (or the step): an optimizer step under an accumulation gate of the same
    loop, else an accumulation loop with the step after it. A gated step does not count when another optimizer
    of that loop steps every micro-batch (a GAN: which step the backward feeds is unclear)."""
    facts = loop.facts
    for anchor, helpers in caller_chains(facts, backward, depth):
        function = facts.enclosing_function(anchor)
        for step, gate in gated_steps(loop, depth):
            if facts.enclosing_function(gate.node) is not function or facts.is_within(anchor, gate.node):
                continue
            around = common_loop(facts, anchor, gate.node)
            if around is None and not called_in_loop(facts, function, depth):
                continue
            scope = around if around is not None else function
            if scope is None or all(accumulation_gates(loop, s.call, depth) for s in steps_in(loop, [scope])):
                return Window(anchor, helpers, step, gate, around)
            return loop_window(loop, backward, depth)
    return loop_window(loop, backward, depth)


def loop_window(loop: TrainingLoop, backward: cst.Call, depth: int) -> Window | None:
    """The window of an accumulation loop (``for micro_step in range(accum_steps):``, the step after it) that the
    backward call ``backward`` runs in, through up to ``depth`` levels of helpers."""
    for anchor, helpers in caller_chains(loop.facts, backward, depth):
        inner = loop.accumulation_loop(anchor)
        if inner is not None:
            return Window(anchor, helpers, inner.step, None, inner.outer, inner)
    return None


def steps_outside(loop: TrainingLoop, window: Window) -> list[StepSite]:
    """The optimizer steps of the window's function (and, when its loop is in the callers, of theirs) that do not
    close the window: not under its gate, nor its step after the accumulation loop (a step after the loop for a
    last partial window)."""
    facts = loop.facts
    function = facts.enclosing_function(window.step.call)
    scopes = [function if function is not None else facts.index.module]
    if window.loop is None and function is not None:
        scopes.extend(f for call in facts.call_sites(function) if (f := facts.enclosing_function(call)))
    if window.gate is not None:
        closing = {id(call) for call in facts.reachable_calls(window.gate.node.body)}
    else:
        closing = {id(window.step.call)}
    return [step for step in steps_in(loop, scopes) if id(step.call) not in closing]


def unstepped_tail(loop: TrainingLoop, window: Window) -> bool:
    """Whether the last micro-batches of a pass over the loader may never be stepped: the gate is a plain modulo of
    the loop's own batch index (``(i + 1) % k == 0``, not a counter that runs on across passes), the loop iterates
    a loader (not a ``range``), and no optimizer step outside the gate catches the rest."""
    facts = loop.facts
    gate = window.gate
    if gate is None or gate.kind != "modulo" or facts.within(gate.node.test, cst.BooleanOperation):
        return False
    iterated = loop_iterable(window.loop)
    if iterated is None or (isinstance(iterated, cst.Call) and facts.method_name(iterated) == "range"):
        return False
    counters = {name.value for name in facts.within(window.loop.target, cst.Name)}
    modulos = [n for n in facts.within(gate.node.test, cst.BinaryOperation) if isinstance(n.operator, cst.Modulo)]
    if not any(n.value in counters for modulo in modulos for n in facts.within(modulo.left, cst.Name)):
        return False
    return not steps_outside(loop, window)


def sync_managed(loop: TrainingLoop, window: Window, backward: cst.Call) -> bool:
    """Whether the code already decides when the wrapper syncs for ``backward`` in ``window``: a no_sync-like block
    around it (or around the call of its helper), or, where the backward, its helpers or the step run (and in the
    local functions those call), a mention of a sync control or a forward past the wrapper (``ddp.module(x)``)."""
    facts = loop.facts
    nodes = [backward, *window.helpers]
    if any(loop.no_sync_of(node) is not None for node in nodes):
        return True
    scopes = {id(s): s for s in (facts.enclosing_function(node) for node in (*nodes, window.step.call))}
    containers = [scope if scope is not None else facts.index.module for scope in scopes.values()]
    for container in list(containers):
        containers.extend(f for call in facts.reachable_calls(container) for f in facts.local_functions(call))
    return any(mentions_sync_control(loop, c) or inner_module_forwards(facts, c) for c in containers)


def reads_unsynced_gradients(loop: TrainingLoop, window: Window) -> bool:
    """Whether the window's loop clips or reads ``.grad`` outside the window's gate (for an accumulation loop,
    inside it): there it sees each rank's partial gradients whenever the micro-batches skip the sync."""
    facts = loop.facts
    gate = window.gate.node if window.gate is not None else None
    if gate is None:
        scope = window.inner.node
    else:
        scope = window.loop if window.loop is not None else facts.enclosing_function(gate)
    if scope is None:
        return True
    inside = {id(call) for call in facts.reachable_calls(gate.body)} if gate is not None else set()
    if any(id(step.call) not in inside for step in steps_in(loop, [scope], "clip")):
        return True
    calls = [call for call in facts.reachable_calls(scope) if id(call) not in inside]
    containers = [scope, *(f for call in calls for f in facts.local_functions(call))]
    return any(
        node.attr.value == "grad" and (gate is None or not facts.is_within(node, gate))
        for container in containers
        for node in facts.within(container, cst.Attribute)
    )
