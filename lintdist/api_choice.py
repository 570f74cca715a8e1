"""Whether code chooses at run time between an old and a new spelling of an API: a branch of a version or
``hasattr`` test, one branch of an ``if`` whose other branch names the new API, the handler of a ``try`` that
tries the new API first, or code after an early ``if`` that tests for (or uses) the new API and returns."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts

CHOICE_WORDS = ("version", "hasattr")


def names_any(facts: PythonFacts, tree: cst.CSTNode, names: frozenset[str]) -> bool:
    """``tree`` names one of the qualified ``names`` (an attribute chain, or a name spelled as one of their last
    parts or imported)."""
    last_parts = {name.rsplit(".", 1)[-1] for name in names}
    return any(
        facts.qualified_names(n) & names
        for n in facts.within(tree, cst.Attribute, cst.Name)
        if isinstance(n, cst.Attribute) or n.value in last_parts or n.value in facts.imported_names
    )


def chooses_api(facts: PythonFacts, node: cst.CSTNode, new_names: frozenset[str]) -> bool:
    """``node`` sits in one side of a choice between an old API and the new one (``new_names``): under a version
    or ``hasattr`` test, beside a branch that names the new API, in the handler of a ``try`` that tries it, or after
    an early return that does."""
    child = node
    for ancestor in facts.ancestors(node):
        if isinstance(ancestor, (cst.If, cst.IfExp)):
            if _tests_choice(facts, ancestor.test):
                return True
            branches = (ancestor.body, ancestor.orelse)
            if any(b is not None and b is not child and names_any(facts, b, new_names) for b in branches):
                return True
        elif isinstance(ancestor, cst.Try) and any(child is handler for handler in ancestor.handlers):
            if names_any(facts, ancestor.body, new_names):
                return True
        elif isinstance(ancestor, (cst.IndentedBlock, cst.Module)) and _after_early_choice(
            facts, ancestor, child, new_names
        ):
            return True
        child = ancestor
    return False


def _tests_choice(facts: PythonFacts, test: cst.BaseExpression) -> bool:
    text = facts.index.module.code_for_node(test).lower()
    return any(word in text for word in CHOICE_WORDS)


def _after_early_choice(
    facts: PythonFacts, block: cst.IndentedBlock | cst.Module, statement: cst.CSTNode, new_names: frozenset[str]
) -> bool:
    """An earlier ``if`` of the block tests the version (or names the new API) and returns: ``if
    hasattr(torch, "autocast"): return torch.autocast("cuda")`` followed by the old call."""
    for earlier in block.body:
        if earlier is statement:
            return False
        if (
            isinstance(earlier, cst.If)
            and facts.within(earlier.body, cst.Return, cst.Raise)
            and (_tests_choice(facts, earlier.test) or names_any(facts, earlier.body, new_names))
        ):
            return True
    return False
