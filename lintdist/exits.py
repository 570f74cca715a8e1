"""Where a ``break`` or ``return`` leaves to: the loop it ends."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

if TYPE_CHECKING:
    from lintdist.facts import Loop, PythonFacts

BOUNDARIES = (cst.FunctionDef, cst.Lambda, cst.ClassDef)


def left_loop(facts: PythonFacts, exit_node: cst.Break | cst.Return) -> Loop | None:
    """The loop an exit ends: for a ``break``, the loop whose body holds it (else the nearest loop around it, as in a
    loop's ``else:``); for a ``return``, the outermost loop around it in its function. None outside any loop."""
    if isinstance(exit_node, cst.Break) and facts.enclosing_loop(exit_node) is not None:
        return facts.enclosing_loop(exit_node)
    loops = []
    for ancestor in facts.ancestors(exit_node):
        if isinstance(ancestor, BOUNDARIES):
            break
        if isinstance(ancestor, (cst.For, cst.While)):
            loops.append(ancestor)
    if not loops:
        return None
    return loops[0] if isinstance(exit_node, cst.Break) else loops[-1]
