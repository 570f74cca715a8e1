"""Command-line arguments a script declares: what ``args.<name>`` holds when the launch does not pass it."""

from __future__ import annotations

import libcst as cst

from lintdist.facts import PythonFacts, argument_of


def command_line_default(facts: PythonFacts, expr: cst.BaseExpression) -> cst.BaseExpression | None:
    """The ``default=`` of the ``parser.add_argument(...)`` in this file that declares ``args.<name>`` (``--name``,
    ``--name-with-dashes``, or ``dest="name"``), where ``expr`` reads ``<something>.<name>``; None when no declaration
    is in sight, or it gives no default."""
    if not isinstance(expr, cst.Attribute):
        return None
    name = expr.attr.value
    for call in facts.calls:
        if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "add_argument"):
            continue
        if name not in _destinations(call):
            continue
        return argument_of(call, "default", None)
    return None


def _destinations(call: cst.Call) -> set[str]:
    dest = argument_of(call, "dest", None)
    if isinstance(dest, cst.SimpleString):
        return {str(dest.evaluated_value)}
    flags = [
        str(arg.value.evaluated_value)
        for arg in call.args
        if arg.keyword is None and isinstance(arg.value, cst.SimpleString)
    ]
    long = [flag for flag in flags if flag.startswith("--")]
    chosen = long[:1] or flags[:1]
    return {flag.lstrip("-").replace("-", "_") for flag in chosen}


def passed_arg(call: cst.Call, keyword: str, position: int) -> cst.Arg | None:
    """The ``Arg`` a call passes for a parameter, by keyword (also after ``**kwargs``) or by position (none after a
    ``*args``)."""
    positional = 0
    starred = False
    for arg in call.args:
        if arg.keyword is not None:
            if arg.keyword.value == keyword:
                return arg
        elif arg.star:
            starred = starred or arg.star == "*"
        elif not starred:
            if positional == position:
                return arg
            positional += 1
    return None
