"""Which tensors have a shape of their own on each rank: the sequences ``generate`` returns (each rank stops at its
own EOS and pads its prompts to its own longest), followed through names, slices and same-shape methods, unless
padded to a common shape across processes (``pad_across_processes``) on the way."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
from libcst.helpers import get_full_name_for_node

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts

# Methods that return a tensor of the same shape (or a slice of it, still as long as this rank's)
SAME_SHAPE_METHODS = frozenset({"to", "cpu", "cuda", "contiguous", "long", "int", "detach", "clone", "float"})
PADDING_METHODS = frozenset({"pad_across_processes"})
MAX_DEPTH = 6


def generated_sequences(
    facts: PythonFacts, expr: cst.BaseExpression, at: cst.CSTNode, depth: int = 0
) -> cst.Call | None:
    """The ``generate(...)`` call whose output ``expr`` holds at ``at`` (``out``, ``out[:, n:]``, ``out.cpu()``,
    ``out.sequences``), or None: not one, or padded across processes after it (an assignment from
    ``pad_across_processes``)."""
    if depth > MAX_DEPTH:
        return None
    if isinstance(expr, cst.Subscript):
        return generated_sequences(facts, expr.value, at, depth + 1)
    if isinstance(expr, cst.Attribute) and expr.attr.value == "sequences":
        return generated_sequences(facts, expr.value, at, depth + 1)
    if isinstance(expr, cst.Call):
        method = facts.method_name(expr)
        if method == "generate":
            return expr
        if method in SAME_SHAPE_METHODS and isinstance(expr.func, cst.Attribute):
            return generated_sequences(facts, expr.func.value, at, depth + 1)
        return None
    if not isinstance(expr, (cst.Name, cst.Attribute)):
        return None
    # every assignment of the name in its function (or at module level): the generate output only if each one is
    # (a name also padded somewhere, `out = accelerator.pad_across_processes(out, ...)`, is not)
    key = get_full_name_for_node(expr)
    bindings = facts.bindings(key, at) if key else []
    found = None
    for binding in bindings:
        if facts.is_within(at, binding.statement):
            continue  # the statement that reads it (`tokens, labels = gather_for_metrics((tokens, labels))`)
        value = binding.value
        if binding.index is not None or (isinstance(value, cst.Call) and facts.method_name(value) in PADDING_METHODS):
            return None
        inner = generated_sequences(facts, value, value, depth + 1)
        if inner is None:
            return None
        found = found or inner
    return found
