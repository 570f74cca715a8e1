"""lintdist/api_choice.py: code that chooses at run time between an old and a new spelling of an API."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.api_choice import chooses_api, names_any
from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex

NEW = frozenset({"torch.amp.autocast", "torch.autocast"})


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


def _old_calls(facts: PythonFacts) -> dict[str, bool]:
    """Each ``torch.cuda.amp.autocast()`` call by its function: whether it sits in a choice."""
    module = facts.index.module
    return {
        facts.enclosing_function(call).name.value: chooses_api(facts, call, NEW)
        for call in facts.calls
        if module.code_for_node(call.func) == "torch.cuda.amp.autocast"
    }


def test_choices_by_test_branch_handler_and_early_return():
    facts = _facts(
        """
        import torch
        def by_version():
            if torch.__version__ < "2.4":
                return torch.cuda.amp.autocast()
        def by_branch(flag):
            ctx = torch.autocast("cuda") if flag else torch.cuda.amp.autocast()
        def by_handler():
            try:
                ctx = torch.amp.autocast("cuda")
            except AttributeError:
                ctx = torch.cuda.amp.autocast()
        def by_early_return():
            if hasattr(torch, "autocast"):
                return torch.autocast("cuda")
            return torch.cuda.amp.autocast()
        def plain(flag):
            if flag:
                return torch.cuda.amp.autocast()
            return None
        def early_return_elsewhere(flag):
            if flag:
                return None
            return torch.cuda.amp.autocast()
        """
    )
    assert _old_calls(facts) == {
        "by_version": True,
        "by_branch": True,
        "by_handler": True,
        "by_early_return": True,
        "plain": False,
        "early_return_elsewhere": False,
    }


def test_names_any_through_imports():
    facts = _facts("from torch import autocast as ac\nimport torch\nac('cuda')\ntorch.cuda.amp.autocast()\n")
    first, second = facts.index.module.body[2], facts.index.module.body[3]
    assert names_any(facts, first, NEW)
    assert not names_any(facts, second, NEW)
