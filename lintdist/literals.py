"""What a literal says: its truth, whether a count is at most one, and the entries of a literal mapping.

A setting written as a literal (``fsdp="full_shard"``, ``gradient_accumulation_steps=1``,
``{"gradient_accumulation_kwargs": {...}}``, ``AcceleratorConfig(...)``) is read here; anything else is
"unknown" (None) and the caller decides what unknown means.
"""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import PythonFacts, argument_of


def is_name(expr: cst.CSTNode | None, value: str) -> bool:
    """Whether ``expr`` is the bare name ``value``: a constant (``True``, ``False``, ``None``) or a variable."""
    return isinstance(expr, cst.Name) and expr.value == value


def literal_truth(expr: cst.BaseExpression) -> bool | None:
    """Python truth of a literal (``True``, ``"full_shard"``, ``0``, ``[...]``); None for anything else."""
    if isinstance(expr, cst.Name) and expr.value in {"True", "False", "None"}:
        return expr.value == "True"
    if isinstance(expr, cst.SimpleString):
        return bool(expr.evaluated_value)
    if isinstance(expr, cst.Integer):
        return int(expr.evaluated_value) != 0
    if isinstance(expr, (cst.List, cst.Tuple)):
        return bool(expr.elements)
    return None


def at_most_one(expr: cst.BaseExpression, facts: PythonFacts, at: cst.CSTNode) -> bool:
    """Whether a count is the literal 1 (or 0), directly or through a name bound only to such literals."""
    if isinstance(expr, cst.Integer):
        return int(expr.evaluated_value) <= 1
    if isinstance(expr, cst.Name):
        origins = facts.origins(expr, at)
        return bool(origins) and all(
            isinstance(o.node, cst.Integer) and int(o.node.evaluated_value) <= 1 for o in origins
        )
    return False


def is_mapping_call(expr: cst.CSTNode, suffix: str) -> bool:
    """Whether ``expr`` is a call of a class whose name ends in ``suffix`` (``AcceleratorConfig(...)``), so that
    its keywords are a literal mapping."""
    return isinstance(expr, cst.Call) and (get_full_name_for_node(expr.func) or "").endswith(suffix)


def readable_mapping(expr: cst.CSTNode) -> bool:
    """Whether every entry of a dict literal or a call's keywords can be read: no ``**`` unpacking in it."""
    if isinstance(expr, cst.Dict):
        return all(isinstance(e, cst.DictElement) for e in expr.elements)
    return isinstance(expr, cst.Call) and not any(arg.star for arg in expr.args)


def dict_key(element: cst.DictElement) -> str | None:
    """The text of a dict element's string key; None for any other key."""
    return element.key.evaluated_value if isinstance(element.key, cst.SimpleString) else None


def mapping_entry(expr: cst.CSTNode, key: str) -> cst.BaseExpression | None:
    """The value a dict literal (``{"key": value}``) or a call (``Config(key=value)``) gives ``key``; None when
    it gives none."""
    if isinstance(expr, cst.Dict):
        return next((e.value for e in expr.elements if isinstance(e, cst.DictElement) and dict_key(e) == key), None)
    if isinstance(expr, cst.Call):
        return argument_of(expr, key, None)
    return None
