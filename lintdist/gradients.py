"""What code does to gradients: enter ``no_grad``, freeze parameters (``requires_grad`` set to False, directly
or through a local helper given False), and detach a value on its way into a loss.
"""

from __future__ import annotations

import libcst as cst

from lintdist.facts import NO_GRAD_CONTEXTS, PythonFacts, argument_of
from lintdist.literals import is_name


def context_callee(item: cst.WithItem) -> cst.BaseExpression:
    """What a ``with`` item enters: ``torch.no_grad`` for ``torch.no_grad()``, the expression itself otherwise."""
    return item.item.func if isinstance(item.item, cst.Call) else item.item


def enters_no_grad(facts: PythonFacts, node: cst.With) -> bool:
    """Whether a ``with`` statement enters ``torch.no_grad()`` or ``torch.inference_mode()``."""
    return any(not facts.qualified_names(context_callee(item)).isdisjoint(NO_GRAD_CONTEXTS) for item in node.items)


def freezes(small: cst.BaseSmallStatement) -> bool:
    """Whether a statement freezes a parameter: ``p.requires_grad = False``."""
    return (
        isinstance(small, cst.Assign)
        and is_name(small.value, "False")
        and any(_is_attribute(t.target, "requires_grad") for t in small.targets)
    )


def freezes_call(facts: PythonFacts, call: cst.Call) -> bool:
    """Whether a call freezes a module: ``m.requires_grad_(False)``, or a local helper that sets
    ``requires_grad`` from a parameter given False (CycleGAN's ``set_requires_grad(disc, False)``, StyleGAN2's
    ``requires_grad(model, flag)``)."""
    if facts.method_name(call) == "requires_grad_" and is_name(argument_of(call, "requires_grad", 0), "False"):
        return True
    for function in facts.local_functions(call):
        params = [*function.params.posonly_params, *function.params.params]
        if isinstance(call.func, cst.Attribute) and params and params[0].name.value in {"self", "cls"}:
            params = params[1:]
        for index, param in enumerate(params):
            value = argument_of(call, param.name.value, index)
            if is_name(param.default if value is None else value, "False") and sets_requires_grad(
                facts, function, param.name.value
            ):
                return True
    return False


def sets_requires_grad(facts: PythonFacts, function: cst.FunctionDef, name: str) -> bool:
    """Whether a function sets ``requires_grad`` from its parameter ``name``: ``p.requires_grad = name`` or
    ``m.requires_grad_(name)``."""
    for node in facts.within(function.body, cst.Assign, cst.Call):
        if isinstance(node, cst.Assign):
            target = node.targets[0].target if len(node.targets) == 1 else None
            if _is_attribute(target, "requires_grad") and is_name(node.value, name):
                return True
        elif _is_attribute(node.func, "requires_grad_") and len(node.args) == 1 and is_name(node.args[0].value, name):
            return True
    return False


def under_detach(facts: PythonFacts, node: cst.CSTNode, root: cst.CSTNode) -> bool:
    """Whether ``node`` reaches ``root`` through a ``.detach`` on the way up (``x.detach()``, ``f(x).detach()``)."""
    for ancestor in facts.ancestors(node):
        if ancestor is root:
            return False
        if isinstance(ancestor, cst.Attribute) and ancestor.attr.value == "detach":
            return True
    return False


def _is_attribute(expr: cst.CSTNode | None, attr: str) -> bool:
    return isinstance(expr, cst.Attribute) and expr.attr.value == attr


def runs_in_step(facts: PythonFacts, node: cst.CSTNode, block: cst.CSTNode) -> bool:
    """Whether ``node`` runs, with gradients, as part of ``block``: not in a function, lambda or class defined
    inside it, and not under ``no_grad``/``inference_mode``."""
    for ancestor in facts.ancestors(node):
        if ancestor is block:
            return True
        if isinstance(ancestor, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            return False
        if isinstance(ancestor, cst.With) and enters_no_grad(facts, ancestor):
            return False
    return True


def gradient_sources(
    facts: PythonFacts, expr: cst.BaseExpression, block: cst.CSTNode, before: cst.CSTNode
) -> list[cst.CSTNode]:
    """``expr`` and the values assigned, in ``block`` before ``before``, to the names it reads (and to theirs):
    where its gradient can come from; names read through a ``.detach`` are not followed."""
    order = facts.index.order
    assignments = [a for a in facts.within(block, cst.Assign, cst.AugAssign, cst.AnnAssign) if order(a) < order(before)]
    sources, pending, seen = [], [expr], set()
    while pending:
        current = pending.pop()
        sources.append(current)
        for name in facts.within(current, cst.Name):
            if name.value in seen or under_detach(facts, name, current):
                continue
            seen.add(name.value)
            for assign in assignments:
                targets = [t.target for t in assign.targets] if isinstance(assign, cst.Assign) else [assign.target]
                if assign.value is not None and any(
                    n.value == name.value for t in targets for n in facts.within(t, cst.Name)
                ):
                    pending.append(assign.value)
    return sources


def flows_into(facts: PythonFacts, node: cst.CSTNode, source: cst.CSTNode) -> bool:
    """Whether ``node`` is part of ``source`` and its result is not detached on the way."""
    return (node is source or facts.is_within(node, source)) and not under_detach(facts, node, source)
