"""Several edits of one file as one replacement: nodes replaced and statements put in beside others, rebuilt along
the paths to them only."""

from __future__ import annotations

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.syntax import child_fields

Statements = dict[int, list[cst.BaseStatement]]


def block_statement(facts: PythonFacts, node: cst.CSTNode, block: cst.CSTNode | None) -> cst.CSTNode | None:
    """The child of ``block`` (an indented block or the module) that holds ``node``; None when none does."""
    child = node
    for ancestor in facts.ancestors(node):
        if ancestor is block:
            return child
        child = ancestor
    return None


def common_ancestor(facts: PythonFacts, nodes: list[cst.CSTNode]) -> cst.CSTNode:
    """The innermost node holding every one of ``nodes`` (a node holds itself)."""
    paths = [[node, *facts.ancestors(node)] for node in nodes]
    shared = {id(a) for a in paths[0]}
    for path in paths[1:]:
        shared &= {id(a) for a in path}
    return next(a for a in paths[0] if id(a) in shared)


def joint_replacement(
    facts: PythonFacts,
    touched: list[cst.CSTNode],
    replace: dict[int, cst.CSTNode],
    before: Statements,
    after: Statements,
) -> tuple[cst.CSTNode, cst.CSTNode]:
    """(old, new) for the smallest node around the parents of ``touched``: nodes replaced by id (``replace``) and
    statements put in before or after others (by id); ``touched`` names every node edited or inserted beside."""
    root = common_ancestor(facts, [facts.parent(node) for node in touched])
    on_path = {id(a) for node in touched for a in facts.ancestors(node)} | {id(node) for node in touched}
    return root, _rebuild(root, replace, before, after, on_path)


def _rebuild(
    node: cst.CSTNode, replace: dict[int, cst.CSTNode], before: Statements, after: Statements, on_path: set[int]
) -> cst.CSTNode:
    if id(node) in replace:
        return replace[id(node)]
    if id(node) not in on_path:
        return node
    changes = {}
    for name in child_fields(type(node)):
        value = getattr(node, name)
        if isinstance(value, cst.CSTNode):
            new = _rebuild(value, replace, before, after, on_path)
            if new is not value:
                changes[name] = new
        elif isinstance(value, (tuple, list)):
            items, changed = [], False
            for item in value:
                if not isinstance(item, cst.CSTNode):
                    items.append(item)
                    continue
                new = _rebuild(item, replace, before, after, on_path)
                extra_before, extra_after = before.get(id(item), []), after.get(id(item), [])
                changed = changed or new is not item or bool(extra_before or extra_after)
                items.extend([*extra_before, new, *extra_after])
            if changed:
                changes[name] = tuple(items)
    return node.with_changes(**changes) if changes else node
