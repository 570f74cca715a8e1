"""Which conditions a node runs under: the ``if`` (or ``while``) statements whose branch holds it, innermost first.

Rules that ask "is this statement under a test of X?" walk up from the node the same way; this is that walk, once.
The answers come from the facts' parent index (no walk of the tree).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts

SCOPES = (cst.FunctionDef, cst.Lambda, cst.ClassDef)


def surrounding_tests(
    facts: PythonFacts,
    node: cst.CSTNode,
    *,
    until: cst.CSTNode | None = None,
    kinds: tuple[type, ...] = (cst.If,),
    scopes: tuple[type, ...] = SCOPES,
) -> list[cst.If | cst.While]:
    """The statements of ``kinds`` (``if`` by default) that ``node`` sits in a branch of (their body or ``else``,
    not their test), innermost first, up to ``until`` or the first of ``scopes`` around it (both left out)."""
    found = []
    child = node
    for ancestor in facts.ancestors(node):
        if ancestor is until or isinstance(ancestor, scopes):
            break
        if isinstance(ancestor, kinds) and child is not ancestor.test:
            found.append(ancestor)
        child = ancestor
    return found
