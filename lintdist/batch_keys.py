"""How a script spells the keys of a batch dict: ``batch["labels"]`` reads and writes, the quote it writes keys
with, and a key named anywhere in a scope (a string, a keyword)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import string_key, string_value

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts


def keyed(facts: PythonFacts, scope: cst.CSTNode, base: cst.BaseExpression, key: str) -> bool:
    """``scope`` reads or writes ``<base>["<key>"]`` (``base`` by its full name: ``batch``, ``self.batch``)."""
    name = get_full_name_for_node(base)
    return bool(name) and any(
        string_key(node) == key and get_full_name_for_node(node.value) == name
        for node in facts.within(scope, cst.Subscript)
    )


def key_quote(facts: PythonFacts, base: cst.BaseExpression) -> str:
    """The quote the file writes ``base``'s string keys with (its first ``base["..."]``), ``"`` when none."""
    name = get_full_name_for_node(base)
    for node in facts.within(facts.index.module, cst.Subscript):
        if string_key(node) is not None and get_full_name_for_node(node.value) == name:
            return node.slice[0].slice.value.quote
    return '"'


def mentions_key(facts: PythonFacts, scope: cst.CSTNode, key: str) -> bool:
    """``scope`` names ``key`` as a string (``if "shift_labels" not in batch``) or a keyword (``update(key=...)``)."""
    return any(string_value(node) == key for node in facts.within(scope, cst.SimpleString)) or any(
        a.keyword is not None and a.keyword.value == key for c in facts.within(scope, cst.Call) for a in c.args
    )
