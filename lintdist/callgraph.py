"""Whether two places run in one program: the same function or class, or both reached from one function."""

from __future__ import annotations

import libcst as cst

from lintdist.facts import PythonFacts


def unit_of(facts: PythonFacts, node: cst.CSTNode) -> cst.CSTNode | None:
    """The unit ``node`` belongs to: its class, else its function (itself for a function); None at module level."""
    cls = facts.enclosing_class(node)
    if cls is not None:
        return cls
    return node if isinstance(node, cst.FunctionDef) else facts.enclosing_function(node)


def run_together(facts: PythonFacts, first: cst.CSTNode, second: cst.CSTNode) -> bool:
    """Whether two places may run in one program: either is at module level, both are in one unit, or some
    function (or the module's own code) reaches both units through the file's calls."""
    a, b = unit_of(facts, first), unit_of(facts, second)
    if a is None or b is None or a is b:
        return True
    pair = {id(a), id(b)}
    roots = [f for functions in facts.functions.values() for f in functions]
    return any(pair <= reached_units(facts, root) for root in roots) or pair <= reached_units(facts, None)


def reached_units(facts: PythonFacts, root: cst.FunctionDef | None) -> set[int]:
    """The ids of the units ``root`` reaches through calls of the file's functions (with its own unit); for
    None, those the module-level code reaches."""
    memo = facts._memo.setdefault("reached_units", {})
    if id(root) not in memo:
        if root is None:
            calls = [c for c in facts.calls if unit_of(facts, c) is None]
            units: set[int] = set()
        else:
            calls = facts.reachable_calls(root)
            units = {id(unit_of(facts, root))}
        pending = list(calls)
        seen: set[int] = set()
        while pending:
            call = pending.pop()
            for function in facts.local_functions(call):
                if id(function) not in seen:
                    seen.add(id(function))
                    units.add(id(unit_of(facts, function)))
                    pending.extend(facts.reachable_calls(function))
        memo[id(root)] = units
    return memo[id(root)]


def registered(facts: PythonFacts, function: cst.FunctionDef) -> bool:
    """``function`` is handed by name to a ``register_*`` call (a hook: whoever fires it decides where it runs)."""
    name = function.name.value
    return any(
        (facts.method_name(call) or "").startswith("register_")
        and any(isinstance(a.value, cst.Name) and a.value.value == name for a in call.args)
        for call in facts.calls
    )
