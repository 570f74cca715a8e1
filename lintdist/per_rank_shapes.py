"""Which tensors have a shape of their own on each rank: the sequences ``generate`` returns (each rank stops at its
own EOS and pads its prompts to its own longest), and the elements a boolean mask selects (as many as the mask has
``True`` on this rank), followed through names, slices and same-shape methods, unless padded to a common shape
across processes (``pad_across_processes``) on the way."""

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
    found = per_rank_source(facts, expr, at, depth)
    return found if is_generate(facts, found) else None


def is_generate(facts: PythonFacts, node: cst.CSTNode | None) -> bool:
    """``node`` is a ``generate(...)`` call (of the sources ``per_rank_source`` answers)."""
    return isinstance(node, cst.Call) and facts.method_name(node) == "generate"


def _boolean_index(node: cst.Subscript) -> bool:
    """``x[m.bool()]``: one index, a ``.bool()`` call (a mask, whatever ``m`` held)."""
    if len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
        return False
    index = node.slice[0].slice.value
    return isinstance(index, cst.Call) and isinstance(index.func, cst.Attribute) and index.func.attr.value == "bool"


def per_rank_source(
    facts: PythonFacts, expr: cst.BaseExpression, at: cst.CSTNode, depth: int = 0
) -> cst.CSTNode | None:
    """What gives ``expr`` (at ``at``) a length of its own on each rank, followed as ``generated_sequences`` follows
    a ``generate`` output: that ``generate(...)`` call, or a boolean-mask selection (``x[mask.bool()]``,
    ``torch.masked_select(x, mask)``, ``x.masked_select(mask)``: as many elements as the mask has ``True`` on this
    rank); None when neither, or when padded across processes on the way."""
    if depth > MAX_DEPTH:
        return None
    if isinstance(expr, cst.Subscript):
        return expr if _boolean_index(expr) else per_rank_source(facts, expr.value, at, depth + 1)
    if isinstance(expr, cst.Attribute) and expr.attr.value == "sequences":
        return per_rank_source(facts, expr.value, at, depth + 1)
    if isinstance(expr, cst.Call):
        method = facts.method_name(expr)
        if method in {"generate", "masked_select"}:
            return expr
        if method in SAME_SHAPE_METHODS and isinstance(expr.func, cst.Attribute):
            return per_rank_source(facts, expr.func.value, at, depth + 1)
        return None
    if not isinstance(expr, (cst.Name, cst.Attribute)):
        return None
    # every assignment of the name in its function (or at module level): a per-rank length only if each one has one
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
        inner = per_rank_source(facts, value, value, depth + 1)
        if inner is None:
            return None
        found = found or inner
    return found
