"""Which calls build a ``torch.optim`` optimizer, and whether the script steps the optimizer a call builds."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts

OPTIMIZERS = frozenset(
    {"SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adadelta", "Adamax", "NAdam", "RAdam", "ASGD", "Adafactor"}
)


def optimizer_class(facts: PythonFacts, call: cst.Call) -> str | None:
    """The ``torch.optim`` class a call builds (``"AdamW"``), any import spelling; None for other calls."""
    if not isinstance(call.func, (cst.Name, cst.Attribute)):
        return None
    for name in facts.qualified_names(call.func):
        parts = name.split(".")
        if parts[:2] == ["torch", "optim"] and parts[-1] in OPTIMIZERS:
            return parts[-1]
    return None


def stepped(facts: PythonFacts, constructor: cst.Call) -> bool:
    """The script calls ``step()`` on the optimizer ``constructor`` builds, or on what ``prepare`` made of it."""
    for call in facts.calls:
        if facts.method_name(call) != "step" or not isinstance(call.func, cst.Attribute) or call.args:
            continue
        for origin in facts.origins(call.func.value, call):
            node = origin.node
            if node is constructor:
                return True
            if isinstance(node, cst.Call) and origin.index is not None and facts.is_prepare_call(node):
                positional = [arg.value for arg in node.args if arg.keyword is None and not arg.star]
                if origin.index < len(positional) and any(
                    o.node is constructor for o in facts.origins(positional[origin.index], node)
                ):
                    return True
    return False
