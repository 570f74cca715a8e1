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


# method -> index of the namespace in its result (``parse_known_args`` returns the namespace and the rest)
PARSE_METHODS = {"parse_args": None, "parse_known_args": 0}


def declared_options(facts: PythonFacts) -> set[str]:
    """The destination (``args.<dest>``) of every ``parser.add_argument(...)`` of this file."""
    return {dest for call in facts.calls if facts.method_name(call) == "add_argument" for dest in _destinations(call)}


def parsed_namespace_names(facts: PythonFacts) -> set[str]:
    """The plain names a ``parse_args()`` result (or ``parse_known_args()``'s namespace) is assigned to."""
    names = set()
    for call in facts.calls:
        method = facts.method_name(call)
        statement = facts.parent(call)
        if method not in PARSE_METHODS or not isinstance(statement, cst.Assign):
            continue
        target = statement.targets[0].target
        index = PARSE_METHODS[method]
        if index is not None and isinstance(target, (cst.Tuple, cst.List)) and target.elements:
            target = target.elements[index].value
        if isinstance(target, cst.Name):
            names.add(target.value)
    return names


def holds_parsed_arguments(facts: PythonFacts, name: str, at: cst.CSTNode) -> bool:
    """Every value ``name`` can hold at ``at`` is a namespace from ``parse_args()``/``parse_known_args()[0]``."""
    origins = facts.origins(cst.Name(name), at)
    return bool(origins) and all(
        isinstance(o.node, cst.Call)
        and facts.method_name(o.node) in PARSE_METHODS
        and PARSE_METHODS[facts.method_name(o.node)] == o.index
        for o in origins
    )


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


def values_passed(facts: PythonFacts, names: list[str], at: cst.CSTNode) -> list[tuple] | None:
    """What each call of this file passes for the parameters ``names`` of the function around ``at`` (a
    parameter's default where a call passes nothing), one tuple per call; None when one of ``names`` is not a
    parameter of it or a call passes ``*args``/``**kwargs``."""
    params = [facts.parameter(name, at) for name in names]
    if not params or None in params:
        return None
    function = params[0][0]
    rows = []
    for site in facts.call_sites(function):
        if any(arg.star for arg in site.args):
            return None
        passed = [facts.argument_for(site, function, param.name.value, index) for _, index, param in params]
        rows.append(tuple(p if p is not None else param.default for p, (_, _, param) in zip(passed, params)))
    return rows
