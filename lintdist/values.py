"""What value an expression or a launch word has, where lintdist can read it."""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import PythonFacts, string_value

# What accelerate's str_to_bool accepts.
BOOL_WORDS = frozenset({"y", "yes", "t", "true", "on", "1", "n", "no", "f", "false", "off", "0"})
CONSTANTS = {"True": True, "False": False, "None": None}
MAX_DEPTH = 4
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


def constant_truth(expr: cst.BaseExpression | None) -> bool | None:
    """The truth of a ``True``/``False``/``None`` or number literal; None for any other expression."""
    if isinstance(expr, cst.Name) and expr.value in CONSTANTS:
        return expr.value == "True"
    if isinstance(expr, (cst.Integer, cst.Float)):
        return bool(expr.evaluated_value)
    return None


def possible_values(
    facts: PythonFacts, expr: cst.BaseExpression, at: cst.CSTNode, parameters: bool = True
) -> list[tuple[cst.BaseExpression, cst.CSTNode]]:
    """The expressions a name can hold at ``at``, each with where it is read; empty when one is unknown. For a
    parameter (when ``parameters``): what every call site of the file passes, or its default where one passes
    nothing; nothing at all when the function has no call site here (its callers are out of sight)."""
    key = get_full_name_for_node(expr)
    found = facts.bindings(key, at) if key else []
    if found:
        if any(binding.index is not None for binding in found):
            return []
        return [(binding.value, binding.statement) for binding in found]
    parameter = facts.parameter(expr.value, at) if isinstance(expr, cst.Name) and parameters else None
    if parameter is None:
        return []
    function, index, param = parameter
    values = []
    for call in facts.call_sites(function):
        if any(arg.star for arg in call.args):
            return []
        passed = facts.argument_for(call, function, param.name.value, index)
        if passed is not None:
            values.append((passed, call))
        elif param.default is not None:
            values.append((param.default, function))
        else:
            return []
    return values


def truth(
    facts: PythonFacts, expr: cst.BaseExpression, at: cst.CSTNode, *, parameters: bool = True, depth: int = 0
) -> bool | None:
    """True or False when every value ``expr`` can take at ``at`` is a constant of that truth (through names,
    conditional expressions and, when ``parameters``, helper parameters); else None."""
    constant = constant_truth(expr)
    if constant is not None or depth > MAX_DEPTH:
        return constant
    if isinstance(expr, cst.IfExp):
        sides = [truth(facts, side, at, parameters=parameters, depth=depth + 1) for side in (expr.body, expr.orelse)]
        return sides[0] if sides[0] == sides[1] else None
    if not isinstance(expr, (cst.Name, cst.Attribute)):
        return None
    values = possible_values(facts, expr, at, parameters)
    if not values:
        return None
    truths = {truth(facts, value, where, parameters=parameters, depth=depth + 1) for value, where in values}
    return truths.pop() if len(truths) == 1 else None


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


def string_of(facts: PythonFacts, expr: cst.BaseExpression | None, at: cst.CSTNode) -> str | None:
    """The text of the string an expression is: a plain string literal, or the one text of the expressions it may
    come from (``facts.origins``), when each of them is such a literal; None otherwise."""
    text = string_value(expr)
    if text is not None or expr is None:
        return text
    texts = {string_value(o.node) for o in facts.origins(expr, at) if isinstance(o.node, cst.BaseExpression)}
    return texts.pop() if len(texts) == 1 else None
