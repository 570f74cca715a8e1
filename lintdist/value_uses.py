"""Where a call's value goes: dropped (an expression statement, or a name nobody reads), or into a name whose reads
can be listed.

Reads are those of the name in the function (or module) of the assignment, nested functions included, in any order
(a loop may read a name before the assignment's position). The answers come from the facts' indexes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts


def assigned_reads(facts: PythonFacts, value: cst.BaseExpression) -> list[cst.Name] | None:
    """The reads of the one plain name ``value`` is assigned to (``x = value``), in the assignment's function or
    module; None when ``value`` is not assigned to one plain name."""
    assignment = facts.parent(value)
    if not (isinstance(assignment, cst.Assign) and assignment.value is value and len(assignment.targets) == 1):
        return None
    target = assignment.targets[0].target
    if not isinstance(target, cst.Name):
        return None
    function = facts.enclosing_function(assignment)
    return facts.reads_of(target.value, function if function is not None else facts.index.module)


def discarded(facts: PythonFacts, call: cst.Call) -> cst.Expr | cst.Assign | None:
    """The statement that drops ``call``'s value: ``call`` alone on its statement, or ``name = call`` (``_`` too)
    where ``name`` is never read; None when the value may be used."""
    parent = facts.parent(call)
    if isinstance(parent, cst.Expr) and parent.value is call:
        return parent
    reads = assigned_reads(facts, call)
    if reads is not None and (not reads or parent.targets[0].target.value == "_"):
        return parent
    return None
