"""Learning-rate schedulers: which call builds one, what its total length and warmup are, and where it steps.

Constructors of transformers, diffusers and torch schedules with a total length, by qualified name, with the
keyword and position of the length and of the warmup; ``LambdaLR`` takes its schedule from a function instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import argument_of, string_value

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts

Parameter = tuple[str, int]  # (keyword, position)

_TRANSFORMERS_WARMUP = (("num_training_steps", 2), ("num_warmup_steps", 1))
_SCHEDULE_FUNCTIONS = (
    "get_linear_schedule_with_warmup",
    "get_cosine_schedule_with_warmup",
    "get_cosine_with_hard_restarts_schedule_with_warmup",
    "get_polynomial_decay_schedule_with_warmup",
    "get_cosine_with_min_lr_schedule_with_warmup",
    "get_cosine_with_min_lr_schedule_with_warmup_lr_rate",
)
# qualified name -> (the length, the warmup)
LENGTHS: dict[str, tuple[Parameter, Parameter | None]] = {
    # transformers.get_scheduler(name, optimizer, num_warmup_steps, num_training_steps, ...)
    "transformers.get_scheduler": (("num_training_steps", 3), ("num_warmup_steps", 2)),
    "transformers.optimization.get_scheduler": (("num_training_steps", 3), ("num_warmup_steps", 2)),
    # diffusers.optimization.get_scheduler(name, optimizer, step_rules, num_warmup_steps, num_training_steps, ...)
    "diffusers.optimization.get_scheduler": (("num_training_steps", 4), ("num_warmup_steps", 3)),
    "diffusers.get_scheduler": (("num_training_steps", 4), ("num_warmup_steps", 3)),
    **{
        f"{package}.{name}": _TRANSFORMERS_WARMUP
        for package in ("transformers", "transformers.optimization", "diffusers.optimization")
        for name in _SCHEDULE_FUNCTIONS
    },
    "torch.optim.lr_scheduler.LinearLR": (("total_iters", 3), None),
    "torch.optim.lr_scheduler.ConstantLR": (("total_iters", 2), None),
    "torch.optim.lr_scheduler.PolynomialLR": (("total_iters", 1), None),
    "torch.optim.lr_scheduler.CosineAnnealingLR": (("T_max", 1), None),
    "torch.optim.lr_scheduler.OneCycleLR": (("total_steps", 2), None),
}
# OneCycleLR without `total_steps`: `epochs * steps_per_epoch`.
ONE_CYCLE = ("torch.optim.lr_scheduler.OneCycleLR", ("steps_per_epoch", 4))
LAMBDA_SCHEDULERS = frozenset({"torch.optim.lr_scheduler.LambdaLR"})
SCHEDULER_CLASSES = frozenset(LENGTHS) | LAMBDA_SCHEDULERS
# `get_scheduler` names whose schedule has no total length (the length is ignored).
NO_LENGTH = frozenset(
    {"constant", "constant_with_warmup", "inverse_sqrt", "reduce_lr_on_plateau", "piecewise_constant"}
)


def scheduler_class(facts: PythonFacts, call: cst.Call) -> str | None:
    """The qualified name of the scheduler constructor ``call`` is (a length-taking one or ``LambdaLR``), or None."""
    return next((name for name in facts.qualified_names(call.func) if name in SCHEDULER_CLASSES), None)


def scheduler_length(call: cst.Call, qualified: str) -> tuple[str, cst.BaseExpression] | None:
    """(keyword, expression) of the total length a scheduler call is given; None when not given or when the
    schedule has none (``get_scheduler("constant", ...)``, ``LambdaLR``)."""
    if qualified not in LENGTHS:
        return None
    if qualified.endswith("get_scheduler") and string_value(argument_of(call, "name", 0)) in NO_LENGTH:
        return None
    name, position = LENGTHS[qualified][0]
    length = argument_of(call, name, position)
    if length is None and qualified == ONE_CYCLE[0]:
        name, position = ONE_CYCLE[1]
        length = argument_of(call, name, position)
    return (name, length) if length is not None else None


def scheduler_warmup(call: cst.Call, qualified: str) -> cst.BaseExpression | None:
    """The warmup length a scheduler call is given, for the schedules that take one."""
    warmup = LENGTHS[qualified][1] if qualified in LENGTHS else None
    return argument_of(call, *warmup) if warmup is not None else None


def schedule_function(facts: PythonFacts, call: cst.Call) -> cst.Lambda | cst.FunctionDef | None:
    """The function a ``LambdaLR(optimizer, lr_lambda)`` call schedules with: an inline lambda, a lambda bound to
    the name, or the last module-level ``def`` of that name before the call."""
    function = argument_of(call, "lr_lambda", 1)
    if isinstance(function, cst.Lambda):
        return function
    if not isinstance(function, cst.Name):
        return None
    for origin in facts.origins(function, call):
        if isinstance(origin.node, cst.Lambda):
            return origin.node
    order = facts.index.order
    defined = [
        f
        for f in facts.functions.get(function.value, ())
        if facts.enclosing_class(f) is None and order(f) < order(call)
    ]
    return defined[-1] if defined else None


def scheduler_steps(facts: PythonFacts, receivers: set[str]) -> list[cst.Call]:
    """The ``.step()`` calls on the scheduler names ``receivers``; when there are none, on any receiver whose name
    mentions a scheduler (``lr_sched.step()``)."""
    steps = [c for c in facts.calls if facts.method_name(c) == "step" and _receiver(c) in receivers]
    return steps or [
        c for c in facts.calls if facts.method_name(c) == "step" and "sched" in (_receiver(c) or "").lower()
    ]


def _receiver(call: cst.Call) -> str | None:
    return get_full_name_for_node(call.func.value) if isinstance(call.func, cst.Attribute) else None
