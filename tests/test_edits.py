"""``lintdist.edits``: replacements that fixes are made of."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.edits import guarded_call, module_import, receiver_as_argument, replace_nodes
from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def test_guarded_call_puts_a_lone_call_statement_under_an_if():

    module = cst.parse_module(
        textwrap.dedent("""\
        for b in loader:
            # clip
            clip(model)
            norm = clip(model)
            clip(a); clip(b)
        """)
    )
    index = SyntaxIndex(module)
    facts = PythonFacts(index, NameResolver(index))
    first, kept, semi, _ = [c for c in facts.calls if facts.method_name(c) == "clip"]
    line, guard = guarded_call(facts, first, "acc.sync_gradients")
    assert module.code_for_node(replace_nodes(module, ((line, guard),))).splitlines()[1:4] == [
        "    # clip",
        "    if acc.sync_gradients:",
        "        clip(model)",
    ]
    assert guarded_call(facts, kept, "ok") is None
    assert guarded_call(facts, semi, "ok") is None


def test_receiver_as_argument_keeps_keywords_and_drops_parentheses():
    call = cst.parse_expression("(a + b).backward(retain_graph=True)")
    new = receiver_as_argument(call, call.func.value, "accelerator.backward")
    assert cst.Module([]).code_for_node(new) == "accelerator.backward(a + b, retain_graph=True)"
    positional = cst.parse_expression("loss.backward(gradient)")
    assert receiver_as_argument(positional, positional.func.value, "accelerator.backward") is None


def test_module_import_for_a_plain_import_nothing_or_another_name():
    def bindings(code: str) -> list:
        return NameResolver(SyntaxIndex(cst.parse_module(code))).module_bindings("functools")

    assert module_import(bindings("import functools\n"), "functools") == ()
    assert module_import(bindings("x = 1\n"), "functools") == (("functools", None),)
    assert module_import(bindings("from compat import functools\n"), "functools") is None
    assert module_import(bindings("functools = object()\n"), "functools") is None
