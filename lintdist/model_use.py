"""Where a model runs: whether some calls run its forward pass or hand it to code that may."""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import PythonFacts

# Methods of a model that are not its forward pass.
NOT_FORWARD = frozenset(
    {"no_sync", "parameters", "named_parameters", "zero_grad", "train", "eval", "state_dict", "buffers", "modules"}
)


def runs_or_passes(facts: PythonFacts, calls: list[cst.Call], model: cst.BaseExpression, at: cst.CSTNode) -> bool:
    """A call among ``calls`` runs the model ``model`` holds at ``at`` (``model(...)``, ``model.forward(...)``) or
    hands it to a function, which may run it; other methods of the model (``NOT_FORWARD``) are not its forward."""
    key = get_full_name_for_node(model)
    origins = {(id(o.node), o.index) for o in facts.origins(model, at)}

    def same(expr: cst.BaseExpression, where: cst.CSTNode) -> bool:
        if not isinstance(expr, (cst.Name, cst.Attribute)):
            return False
        if key is not None and get_full_name_for_node(expr) == key:
            return True
        return bool(origins & {(id(o.node), o.index) for o in facts.origins(expr, where)})

    for call in calls:
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value in NOT_FORWARD:
            continue
        target = func.value if isinstance(func, cst.Attribute) and func.attr.value == "forward" else func
        if same(target, call) or any(same(arg.value, call) for arg in call.args):
            return True
    return False
