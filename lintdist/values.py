"""What value an expression or a launch word has, where lintdist can read it."""

from __future__ import annotations

import libcst as cst

from lintdist.facts import PythonFacts

# What accelerate's str_to_bool accepts.
BOOL_WORDS = frozenset({"y", "yes", "t", "true", "on", "1", "n", "no", "f", "false", "off", "0"})
CONSTANTS = {"True": True, "False": False, "None": None}
LITERALS = (cst.SimpleString, cst.ConcatenatedString, cst.Integer, cst.Float, cst.Dict)


def known_value(
    facts: PythonFacts, expr: cst.BaseExpression, classes: frozenset[str] = frozenset()
) -> cst.BaseExpression | None:
    """The one expression a value comes from when lintdist can read it: a literal, a ``torch`` enum member,
    a dict, or a call of one of ``classes``. None when it may vary or is unknown."""
    origins = facts.origins(expr)
    if len(origins) != 1 or origins[0].index is not None:
        return None
    node = origins[0].node
    if isinstance(node, LITERALS) or (isinstance(node, cst.Name) and node.value in CONSTANTS):
        return node
    if isinstance(node, cst.Attribute):
        return node if any(n.startswith("torch.") for n in facts.qualified_names(node)) else None
    return node if isinstance(node, cst.Call) and facts.callee_is(node, classes) else None


def python_value(node: cst.BaseExpression | None) -> object:
    """A literal's Python value (strings, numbers, booleans, None); other nodes give themselves."""
    if isinstance(node, cst.Name) and node.value in CONSTANTS:
        return CONSTANTS[node.value]
    if isinstance(node, (cst.SimpleString, cst.ConcatenatedString)):
        value = node.evaluated_value
        return value.decode() if isinstance(value, bytes) else value
    return node.evaluated_value if isinstance(node, cst.Integer) else node


def enum_member(facts: PythonFacts, node: object, enum: str) -> str | None:
    """``SHARD_GRAD_OP`` for ``ShardingStrategy.SHARD_GRAD_OP`` (any import style): the member of a ``torch``
    enum named ``enum``, else None."""
    if not isinstance(node, cst.Attribute):
        return None
    for name in facts.qualified_names(node):
        owner, _, member = name.rpartition(".")
        if name.startswith("torch.") and owner.rsplit(".", 1)[-1] == enum:
            return member
    return None


def parses_as_bool(value: object) -> bool:
    """Whether accelerate reads ``value`` as a boolean (a bool, or a word its ``str_to_bool`` accepts)."""
    return isinstance(value, bool) or str(value).strip().lower() in BOOL_WORDS


def shell_expansion(value: object) -> bool:
    """A flag or variable value the shell fills in (``$RESHARD``, ``${R:-true}``, a backquote): unknown here."""
    return isinstance(value, str) and ("$" in value or "`" in value)


def number_literal(facts: PythonFacts, expr: cst.BaseExpression, at: cst.CSTNode) -> str | None:
    """The number an expression is, as written in the script: a literal, or a name whose every binding is the
    same number literal; None otherwise."""
    if isinstance(expr, (cst.Float, cst.Integer)):
        return expr.value
    if isinstance(expr, cst.Name):
        origins = facts.origins(expr, at)
        if origins and all(isinstance(o.node, (cst.Float, cst.Integer)) for o in origins):
            values = {o.node.value for o in origins}
            return values.pop() if len(values) == 1 else None
    return None
