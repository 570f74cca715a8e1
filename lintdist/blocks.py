"""Statements as a fix sees them: the simple statement holding a node, runs of consecutive statements, a ``with``
block around a run, and the constructions of a class that run a node in its constructor."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import libcst as cst

from lintdist.facts import MAX_DEPTH

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts

Replacement = tuple[cst.CSTNode, cst.CSTNode | cst.RemovalSentinel]


def simple_statement(facts: PythonFacts, node: cst.CSTNode) -> cst.SimpleStatementLine | None:
    """The simple statement line holding ``node`` when it sits directly in a block (None in a compound statement's
    header, a one-line suite or a lambda)."""
    for ancestor in facts.ancestors(node):
        if isinstance(ancestor, cst.SimpleStatementLine):
            return ancestor if isinstance(facts.parent(ancestor), (cst.IndentedBlock, cst.Module)) else None
        if isinstance(ancestor, (cst.BaseCompoundStatement, cst.SimpleStatementSuite, cst.Lambda)):
            return None
    return None


def statement_run(
    facts: PythonFacts,
    statement: cst.SimpleStatementLine,
    marked: set[int],
    joinable: Callable[[cst.SimpleStatementLine], bool],
) -> list[cst.SimpleStatementLine] | None:
    """The consecutive simple statements around ``statement`` from the first to the last one in ``marked`` (ids),
    crossing only statements ``joinable`` accepts; None when ``statement`` itself is not joinable."""
    if not joinable(statement):
        return None
    body = list(facts.parent(statement).body)
    index = next(i for i, s in enumerate(body) if s is statement)
    start = end = index
    for step in (-1, 1):
        scan = index + step
        while 0 <= scan < len(body) and isinstance(body[scan], cst.SimpleStatementLine) and joinable(body[scan]):
            if id(body[scan]) in marked:
                start, end = min(start, scan), max(end, scan)
            scan += step
    return body[start : end + 1]


def with_block(run: Sequence[cst.BaseStatement], item: str | cst.BaseExpression) -> tuple[Replacement, ...]:
    """The replacements that put the consecutive statements ``run`` of one block in one ``with <item>:`` block,
    keeping the first statement's leading comments and blank lines before the block."""
    first = run[0]
    block = cst.With(
        items=[cst.WithItem(cst.parse_expression(item) if isinstance(item, str) else item)],
        body=cst.IndentedBlock(body=[first.with_changes(leading_lines=()), *run[1:]]),
        leading_lines=first.leading_lines,
    )
    return ((first, block), *((s, cst.RemovalSentinel.REMOVE) for s in run[1:]))


def constructions_running(facts: PythonFacts, node: cst.CSTNode) -> list[cst.Call]:
    """The constructions ``Cls(...)`` of this file that run ``node``: it sits in ``Cls.__init__`` or in a method
    only the constructor calls (directly or through other such methods); empty when anything else calls it, or it
    is in no method."""
    function = facts.enclosing_function(node)
    cls = facts.enclosing_class(function) if function is not None else None
    if cls is None:
        return []
    seen = {id(function)}
    pending = [function]
    found: list[cst.Call] = []
    while pending:
        current = pending.pop()
        if facts.enclosing_class(current) is not cls or facts.enclosing_function(current) is not None:
            return []
        sites = facts.call_sites(current)
        if current.name.value == "__init__":
            found.extend(site for site in sites if isinstance(site.func, (cst.Name, cst.Attribute)))
            continue
        if not sites:
            return []
        for site in sites:
            caller = facts.enclosing_function(site)
            if caller is None:
                return []
            if id(caller) not in seen and len(seen) <= MAX_DEPTH:
                seen.add(id(caller))
                pending.append(caller)
    return found


def literal_binding(
    facts: PythonFacts, expr: cst.BaseExpression, at: cst.CSTNode, kind: type
) -> tuple[cst.CSTNode | None, cst.SimpleStatementLine | None]:
    """(the literal, the statement binding it) for ``expr`` when it is a literal of type ``kind`` (no statement),
    or a name bound once, to one, by a one-statement line of ``at``'s function that comes before ``at`` in the
    same block; (None, None) otherwise."""
    if isinstance(expr, kind):
        return expr, None
    if not isinstance(expr, cst.Name):
        return None, None
    bindings = facts.bindings(expr.value, at)
    if len(bindings) != 1 or bindings[0].index is not None or bindings[0].function is not facts.enclosing_function(at):
        return None, None
    binding = bindings[0]
    line = facts.parent(binding.statement)
    if not isinstance(binding.value, kind) or not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
        return None, None
    block = facts.parent(at)
    if facts.parent(line) is not block:
        return None, None
    body = list(block.body)
    before = next(i for i, s in enumerate(body) if s is line) < next(i for i, s in enumerate(body) if s is at)
    return (binding.value, line) if before else (None, None)


def statement_before(
    old: cst.BaseStatement, new: cst.BaseStatement, statement: cst.BaseStatement
) -> cst.FlattenSentinel:
    """The replacement of ``old`` by ``new`` with ``statement`` put before it; ``statement`` takes over ``old``'s
    leading comments and blank lines."""
    return cst.FlattenSentinel(
        [statement.with_changes(leading_lines=old.leading_lines), new.with_changes(leading_lines=())]
    )
