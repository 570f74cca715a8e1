"""What a saved state dict is made of and whose it is: the ``x.state_dict()`` calls behind a saved value, whether the
model ``x`` is the plain module (not a DDP or prepared wrapper), and whether the file loads checkpoints back into the
same model object.

Names are followed to the assignment before the place asked about (``TrainingLoop.binding_before``) and, for the plain
module, to any branch that binds them (``if ddp: g = model.module``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
from libcst.helpers import get_full_name_for_node

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts
    from lintdist.loop import TrainingLoop

# What strips a wrapper: the model is already the plain module.
UNWRAPPING_ATTRIBUTES = frozenset({"module", "_orig_mod"})
LOADING_WORDS = ("load", "restore", "resume", "restart")
MAX_DEPTH = 3


def state_dict_calls(
    facts: PythonFacts, loop: TrainingLoop, obj: cst.BaseExpression, at: cst.CSTNode
) -> list[cst.Call]:
    """The ``x.state_dict()`` calls a saved value is made of: in the expression, or in what the name it is was
    plainly bound to before ``at``."""
    places: list[cst.CSTNode] = [obj]
    binding = _plain_binding(loop, obj, at) if isinstance(obj, cst.Name) else None
    if binding is not None:
        places.append(binding.value)
    found: list[cst.Call] = []
    for place in places:
        for call in [place, *facts.within(place, cst.Call)]:
            if (
                isinstance(call, cst.Call)
                and facts.method_name(call) == "state_dict"
                and isinstance(call.func, cst.Attribute)
                and not call.args
                and call not in found
            ):
                found.append(call)
    return found


def unwrapped(
    facts: PythonFacts, loop: TrainingLoop, model: cst.BaseExpression, at: cst.CSTNode, depth: int = 0
) -> bool:
    """``model`` is the plain module: ``x.module``, ``x._orig_mod``, ``unwrap_model(x)``, either side of a
    conditional expression, or a name last bound to one (or bound to one in some branch)."""
    if isinstance(model, cst.Attribute) and model.attr.value in UNWRAPPING_ATTRIBUTES:
        return True
    if isinstance(model, cst.IfExp):  # `model.module if ddp else model`
        return unwrapped(facts, loop, model.body, at, depth + 1) or unwrapped(facts, loop, model.orelse, at, depth + 1)
    if isinstance(model, cst.Call):
        return facts.method_name(model) == "unwrap_model" or (
            isinstance(model.func, cst.Name) and model.func.value == "unwrap_model"
        )
    if not isinstance(model, (cst.Name, cst.Attribute)) or depth >= MAX_DEPTH:
        return False
    statement = _plain_binding(loop, model, at)
    if statement is not None and unwrapped(facts, loop, statement.value, statement, depth + 1):
        return True
    # `if distributed: g = generator.module` / `else: g = generator`: a name some branch binds to the unwrapped
    # module is the plain model on every path (stylegan2's `g_module`)
    key = get_full_name_for_node(model)
    bound = facts.bindings(key, at) if key else []
    return any(b.index is None and unwrapped(facts, loop, b.value, b.statement, depth + 1) for b in bound)


def model_aliases(loop: TrainingLoop, model: cst.BaseExpression, at: cst.CSTNode) -> set[str]:
    """``model``'s spelling and the names it was plainly copied from (``original_model = model``, kept before
    ``torch.compile``): the same model object under other names."""
    keys = {_code(model)}
    current = model
    for _ in range(MAX_DEPTH):
        statement = _plain_binding(loop, current, at) if isinstance(current, (cst.Name, cst.Attribute)) else None
        if statement is None or not isinstance(statement.value, (cst.Name, cst.Attribute)):
            break
        current, at = statement.value, statement
        keys.add(_code(current))
    return keys


def loaded_into(facts: PythonFacts, loop: TrainingLoop, model: cst.BaseExpression, at: cst.CSTNode) -> str | None:
    """How the file spells ``model`` (or an alias of it) where it loads a checkpoint into it:
    ``model.load_state_dict(...)``, or ``model`` handed to a function whose name says it loads
    (``restart_from_checkpoint(..., state_dict=model)``); None when it does not."""
    keys = model_aliases(loop, model, at)
    for call in facts.calls:
        func = call.func
        if (
            facts.method_name(call) == "load_state_dict"
            and isinstance(func, cst.Attribute)
            and _code(func.value) in keys
        ):
            return _code(func.value)
        if any(word in _code(func).rsplit(".", 1)[-1].lower() for word in LOADING_WORDS):
            for argument in call.args:
                if _code(argument.value) in keys:
                    return _code(argument.value)
    return None


def prefix_stripped_when_alone(facts: PythonFacts) -> bool:
    """The file strips a ``module.`` prefix only in a one-process run (open_clip's ``if not args.distributed and
    ...: sd = {k[len('module.'):]: v ...}``): it saves the wrapper's keys on purpose."""
    return any(
        string.evaluated_value in {"module.", "module"} and facts.single_process_branch(string) is not None
        for string in facts.index.nodes(cst.SimpleString)
    )


def _plain_binding(loop: TrainingLoop, expr: cst.BaseExpression, at: cst.CSTNode):
    """The assignment statement last binding ``expr`` before ``at``, unless augmented or unpacked."""
    binding = loop.binding_before(expr, at)
    if binding is None or isinstance(binding, cst.AugAssign) or binding[1]:
        return None
    return binding[0]


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)
