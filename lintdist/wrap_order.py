"""Whether a model was handed to a data-parallel wrapper before a point, or is handed to one after it.

A wrapper here is any call that takes over a model's parameters for data parallelism: ``DistributedDataParallel``,
FSDP1's ``FullyShardedDataParallel``, FSDP2's ``fully_shard`` (in place), an ``Accelerator``'s ``prepare`` /
``prepare_model`` and ``deepspeed.initialize``. A model is the same object when it is read through the same name
(not bound again in between), through a wrapper's ``.module`` or through ``accelerator.unwrap_model(...)``, or
when its name holds a wrapper's result. Only one function (or the module level) is looked at: the order of two
methods' calls is not known.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.bindings import rebound_between
from lintdist.control import statement_of
from lintdist.facts import PythonFacts, argument_of
from lintdist.reaching import reaching_bindings
from lintdist.wrappers import wrapper_kind

DEEPSPEED_INITIALIZE = frozenset({"deepspeed.initialize"})
PREPARE_METHODS = frozenset({"prepare", "prepare_model"})
UNWRAP_METHODS = frozenset({"unwrap_model"})
# Methods that return the module they are called on: `model = model.to(device)` keeps the same object.
SAME_MODULE_METHODS = frozenset({"to", "cuda", "cpu", "train", "eval", "float", "half", "bfloat16", "double", "requires_grad_"})


@dataclass(frozen=True)
class Wrap:
    """A wrapper call a model goes through: ``kind`` is "ddp", "fsdp1", "fsdp2", "prepare" or "deepspeed"."""

    call: cst.Call
    kind: str


def wrap_kind(facts: PythonFacts, call: cst.CSTNode) -> str | None:
    """The kind of wrapper a call is (see ``Wrap``), or None for any other node."""
    if not isinstance(call, cst.Call):
        return None
    kind = wrapper_kind(facts, call)
    if kind is not None:
        return kind
    if facts.callee_is(call, DEEPSPEED_INITIALIZE):
        return "deepspeed"
    if (
        isinstance(call.func, cst.Attribute)
        and call.func.attr.value in PREPARE_METHODS
        and facts.accelerator_like(call.func.value, call)
    ):
        return "prepare"
    return None


def wrapped_modules(facts: PythonFacts, call: cst.Call, kind: str) -> list[cst.BaseExpression]:
    """The model expressions a wrapper call takes: its first argument (``module=``), ``model=`` for
    ``deepspeed.initialize``, every positional argument of ``prepare``."""
    if kind == "prepare":
        return [arg.value for arg in call.args if arg.keyword is None and not arg.star]
    found = argument_of(call, "model", None) if kind == "deepspeed" else argument_of(call, "module", 0)
    return [found] if found is not None else []


def model_key(facts: PythonFacts, expr: cst.BaseExpression) -> str | None:
    """The dotted name a model expression reads, past a wrapper's ``.module`` and ``accelerator.unwrap_model(...)``
    (``ddp.module`` and ``ddp.module.unet`` read ``ddp``); None when it reads no name."""
    while True:
        inner = _before_module(expr)
        if inner is not None:
            expr = inner
        elif (
            isinstance(expr, cst.Call)
            and facts.method_name(expr) in UNWRAP_METHODS
            and isinstance(expr.func, cst.Attribute)
            and expr.args
        ):
            expr = expr.args[0].value
        else:
            break
    if isinstance(expr, (cst.Name, cst.Attribute)):
        return get_full_name_for_node(expr)
    return None


def wrapped_before(facts: PythonFacts, expr: cst.BaseExpression, at: cst.CSTNode) -> Wrap | None:
    """The wrapper call the model ``expr`` (read at ``at``) went through earlier in the same function: its name
    holds a wrapper's result there, or an earlier wrapper call took it and the name was not bound again since.
    None when none is known (a wrap in another method, another module, or behind an unknown call)."""
    key = model_key(facts, expr)
    if key is None:
        return None
    bindings, _ = reaching_bindings(facts, key, statement_of(facts, at) or at)  # not the binding ``at`` makes
    function = facts.enclosing_function(at)
    for binding in bindings:
        if binding.function is not function:
            continue
        origins = [binding.value] if binding.index is not None else [o.node for o in facts.origins(binding.value)]
        for origin in origins:
            kind = wrap_kind(facts, origin)
            if kind is not None and (binding.index in (None, 0) or kind == "prepare"):
                return Wrap(origin, kind)
    order = facts.index.order
    for call, kind in _wraps_taking(facts, key, function):
        if order(call) < order(at) and not facts.exclusive(call, at):
            scope = function if function is not None else facts.index.module
            if not _replaced(facts, key, call, scope, order(call) + 1, order(at)):
                return Wrap(call, kind)
    return None


def wrapped_after(facts: PythonFacts, expr: cst.BaseExpression, at: cst.CSTNode) -> Wrap | None:
    """The wrapper call that takes the model ``expr`` (read at ``at``) later in the same function, the name not
    bound again in between; None when none does."""
    key = model_key(facts, expr)
    if key is None:
        return None
    function = facts.enclosing_function(at)
    order = facts.index.order
    scope = function if function is not None else facts.index.module
    for call, kind in _wraps_taking(facts, key, function):
        if order(call) > order(at) and not facts.exclusive(call, at):
            if not _replaced(facts, key, at, scope, order(at) + 1, order(statement_of(facts, call) or call)):
                return Wrap(call, kind)
    return None


def _wraps_taking(facts: PythonFacts, key: str, function: cst.CSTNode | None) -> list[tuple[cst.Call, str]]:
    """The wrapper calls of ``function`` (None: the module level) that take the model named ``key``."""
    found = []
    for call in facts.calls:
        if facts.enclosing_function(call) is not function:
            continue
        kind = wrap_kind(facts, call)
        if kind is not None and any(
            get_full_name_for_node(m) == key for m in wrapped_modules(facts, call, kind)
        ):
            found.append((call, kind))
    return found


def _before_module(expr: cst.BaseExpression) -> cst.BaseExpression | None:
    """``ddp`` for ``ddp.module`` and ``ddp.module.unet``; None when no ``.module`` is read."""
    found = None
    while isinstance(expr, cst.Attribute):
        if expr.attr.value == "module":
            found = expr.value
        expr = expr.value
    return found


def _replaced(
    facts: PythonFacts, key: str, at: cst.CSTNode, scope: cst.CSTNode, start: int, stop: int
) -> bool:
    """``key`` is bound to another object between the pre-order positions ``start`` and ``stop`` of ``scope``;
    ``model = model.to(device)`` (a method that returns its module) keeps the same object."""
    if not rebound_between(facts, {key}, scope, start, stop):
        return False
    order = facts.index.order
    function = facts.enclosing_function(at)
    between = [b for b in facts.bindings(key, at) if b.function is function and start <= order(b.statement) < stop]
    return not between or not all(
        b.index is None
        and isinstance(b.value, cst.Call)
        and isinstance(b.value.func, cst.Attribute)
        and b.value.func.attr.value in SAME_MODULE_METHODS
        and get_full_name_for_node(b.value.func.value) == key
        for b in between
    )
