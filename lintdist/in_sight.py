"""Values a fix may read at a place: names that hold a value there, and the one such value a name pattern picks."""

from __future__ import annotations

import re

import libcst as cst

from lintdist.arguments import declared_options, holds_parsed_arguments, parsed_namespace_names
from lintdist.facts import PythonFacts

# Compound statements that always run their body once reached; any other one may skip it.
ALWAYS_RUN = (cst.With, cst.FunctionDef, cst.ClassDef)
SEQUENTIAL = (cst.IndentedBlock, cst.Module, cst.SimpleStatementLine, cst.SimpleStatementSuite)


def holds_value(facts: PythonFacts, name: str, at: cst.CSTNode) -> bool:
    """``name`` holds a value wherever ``at`` runs: a parameter of an enclosing function, a variable the function
    assigns before ``at`` on every path to it, or (when the function does not assign it) one of an enclosing
    function or of the module; at module level, a variable assigned before ``at``."""
    point: cst.CSTNode = at
    function = facts.enclosing_function(at)
    while True:
        if function is not None and facts.parameter(name, point) is not None:
            return True
        local = [
            b
            for b in facts.bindings(name, point)
            if b.function is function and facts.enclosing_class(b.statement) is None
        ]
        if local:
            if function is None and point is not at:
                return True  # a module variable read from a function: set by the time it runs
            return any(_before_on_every_path(facts, b.statement, point) for b in local)
        if function is None:
            return False
        point, function = function, facts.enclosing_function(function)


def _before_on_every_path(facts: PythonFacts, statement: cst.CSTNode, at: cst.CSTNode) -> bool:
    if facts.index.order(statement) >= facts.index.order(at):
        return False
    for ancestor in facts.ancestors(statement):
        if facts.is_within(at, ancestor):
            return isinstance(ancestor, SEQUENTIAL)
        if isinstance(ancestor, cst.BaseCompoundStatement) and not isinstance(ancestor, ALWAYS_RUN):
            return False
    return False


def named_value_in_sight(facts: PythonFacts, at: cst.CSTNode, pattern: re.Pattern[str]) -> str | None:
    """Source text of the one value named by ``pattern`` that holds at ``at``: a variable or parameter (never one
    assigned a boolean, a flag), else ``args.<dest>`` of a parsed command-line option; None when none or several."""
    names = sorted({name for name in _named_variables(facts, pattern) if holds_value(facts, name, at)})
    if names:
        return names[0] if len(names) == 1 else None  # two candidates: which one was meant is not ours to guess
    dests = {dest for dest in declared_options(facts) if pattern.fullmatch(dest)}
    if not dests:
        return None
    namespaces = {
        node.value.value
        for node in facts.index.nodes(cst.Attribute)
        if isinstance(node.value, cst.Name) and node.attr.value in dests
    }
    function = facts.enclosing_function(at)
    while function is not None:  # the parameters of the enclosing functions (`def main(args)`)
        namespaces |= {p.name.value for p in (*function.params.posonly_params, *function.params.params)}
        function = facts.enclosing_function(function)
    namespaces |= parsed_namespace_names(facts)
    found = sorted(
        f"{namespace}.{dest}"
        for namespace in namespaces
        if holds_value(facts, namespace, at) and holds_parsed_arguments(facts, namespace, at)
        for dest in dests
    )
    return found[0] if len(found) == 1 else None


def _named_variables(facts: PythonFacts, pattern: re.Pattern[str]) -> set[str]:
    """Variables and parameters of the file named by ``pattern`` that no assignment gives a boolean."""
    names = {
        name.value
        for name in facts.index.nodes(cst.Name)
        if pattern.fullmatch(name.value) and not isinstance(facts.parent(name), cst.Attribute)
    }
    flags = {
        target.target.value
        for assign in facts.index.nodes(cst.Assign)
        if isinstance(assign.value, cst.Name) and assign.value.value in {"True", "False"}
        for target in assign.targets
        if isinstance(target.target, cst.Name)
    }
    return names - flags
