"""What a script reads from and writes to its process environment: ``os.environ[...]``, ``os.environ.get``,
``os.getenv``, ``os.environ.update`` and ``os.putenv``. Launchers talk to the processes they start through it
(``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``...), so a read says who is expected to set a value, and a write may
overwrite what the launcher set."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import argument_of, string_key, string_value

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts

ENVIRON = frozenset({"os.environ"})
READERS = frozenset({"os.getenv", "os.environ.get"})
WRITERS = frozenset({"os.putenv"})
# How the environment is spelled where it is read (``os.environ``, ``from os import environ, getenv``).
SPELLINGS = frozenset({"os.environ", "environ", "os.getenv", "getenv"})


@dataclass(frozen=True)
class EnvironmentWrite:
    """One write of the environment: the node (the ``os.environ[k] = v`` statement, the ``update``/``putenv``
    call), the variables it sets (literal keys only), how (``store``, ``update``, ``putenv``) and the value
    written (None for ``update``)."""

    node: cst.CSTNode
    keys: tuple[str, ...]
    how: str
    value: cst.BaseExpression | None


def is_environ(facts: PythonFacts, expr: cst.BaseExpression) -> bool:
    """Whether ``expr`` is ``os.environ`` (or a name imported as it)."""
    if isinstance(expr, cst.Attribute):
        return expr.attr.value == "environ" and bool(ENVIRON & facts.qualified_names(expr))
    return isinstance(expr, cst.Name) and "os.environ" in facts.qualified_names(expr)


def environment_key(facts: PythonFacts, expr: cst.BaseExpression) -> str | None:
    """The variable ``expr`` reads (or, as a target, stores): ``"RANK"`` of ``os.environ["RANK"]``,
    ``os.environ.get("RANK")`` and ``os.getenv("RANK")``; None for anything else or a key that is not a literal."""
    if isinstance(expr, cst.Subscript):
        return string_key(expr) if is_environ(facts, expr.value) else None
    if isinstance(expr, cst.Call) and facts.method_name(expr) in {"get", "getenv"}:
        func = expr.func
        if facts.callee_is(expr, READERS) or (isinstance(func, cst.Attribute) and is_environ(facts, func.value)):
            return string_value(argument_of(expr, "key", 0))
    return None


def spells_environment(facts: PythonFacts, node: cst.CSTNode) -> bool:
    """Whether ``node`` names the environment anywhere inside (``os.environ``, ``getenv``...), as written."""
    return any(get_full_name_for_node(part) in SPELLINGS for part in facts.within(node, cst.Name, cst.Attribute))


def reads_environment(facts: PythonFacts, expr: cst.BaseExpression) -> bool:
    """Whether a value comes from the environment (``os.environ.get("MASTER_PORT") or free_port()``,
    ``int(os.environ["RANK"])``), following the names it reads to their assignments."""
    nodes = [expr]
    nodes += [o.node for n in facts.within(expr, cst.Name) for o in facts.origins(n, expr) if o.node is not n]
    return any(
        isinstance(node, cst.CSTNode) and facts.index.order(node) >= 0 and spells_environment(facts, node)
        for node in nodes
    )


def environment_writes(facts: PythonFacts) -> list[EnvironmentWrite]:
    """Every write of the environment in the file: ``os.environ[k] = v`` statements first, then the
    ``os.environ.update(...)`` and ``os.putenv(k, v)`` calls, in the order of the file."""
    found = []
    for statement in facts.index.nodes(cst.Assign):
        for target in statement.targets:
            key = environment_key(facts, target.target) if isinstance(target.target, cst.Subscript) else None
            if key is not None:
                found.append(EnvironmentWrite(statement, (key,), "store", statement.value))
    for call in facts.calls:
        name = facts.method_name(call)
        if name == "update" and isinstance(call.func, cst.Attribute) and is_environ(facts, call.func.value):
            keys = [a.keyword.value for a in call.args if a.keyword is not None]
            if call.args and isinstance(call.args[0].value, cst.Dict) and call.args[0].keyword is None:
                elements = call.args[0].value.elements
                keys += [string_value(e.key) for e in elements if isinstance(e, cst.DictElement)]
            found.append(EnvironmentWrite(call, tuple(k for k in keys if k is not None), "update", None))
        elif name == "putenv" and facts.callee_is(call, WRITERS):
            key = string_value(argument_of(call, "key", 0))
            if key is not None:
                found.append(EnvironmentWrite(call, (key,), "putenv", argument_of(call, "value", 1)))
    return found
