"""``lintdist.edits``: replacements that fixes are made of."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.edits import (
    guarded_call,
    keyword_arg,
    module_import,
    receiver_as_argument,
    repeatable,
    replace_nodes,
    summed,
    with_arg_appended,
    with_arg_first,
    with_last_item,
    without_statements,
)
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


def _appended(code: str, item: cst.Arg | cst.Element) -> str:
    return cst.Module([]).code_for_node(with_last_item(cst.parse_expression(code), item))


def test_an_argument_after_the_others_with_their_separator():
    new = keyword_arg("shift_labels", cst.Name("s"))
    assert _appended("f()", new) == "f(shift_labels=s)"
    assert _appended("f(a)", new) == "f(a, shift_labels=s)"
    assert _appended("f(a,)", new) == "f(a, shift_labels=s,)"
    assert _appended("f(a,b)", new) == "f(a,b,shift_labels=s)"
    assert _appended("f(\n    a,\n    b,\n)", new) == "f(\n    a,\n    b,\n    shift_labels=s,\n)"


def test_an_element_after_the_others_in_a_list_or_set():
    assert _appended("[]", cst.Element(cst.Name("x"))) == "[x]"
    assert _appended("[a, b]", cst.Element(cst.Name("x"))) == "[a, b, x]"
    assert _appended("{a}", cst.Element(cst.Name("x"))) == "{a, x}"


def test_expressions_a_fix_may_write_twice():
    for code in ("ids", "batch['labels']", "x[:, 1:]", "x[..., :-1]", "self.ids[i].to(device)", "y.long().cuda()"):
        assert repeatable(cst.parse_expression(code)), code
    for code in ("make()", "x[f(i)]", "x.to(next(devices))", "x.clone()", "x[i + 1]", "x.to(*args)"):
        assert not repeatable(cst.parse_expression(code)), code


def test_an_argument_appended_on_its_own_line_when_one_per_line():
    new = keyword_arg("shift_labels", cst.Name("s"))
    one = cst.Module([]).code_for_node

    def appended(code: str) -> str:
        return one(with_arg_appended(cst.parse_expression(code), new))

    assert appended("f()") == "f(shift_labels=s)"
    assert appended("f(a,b)") == "f(a,b, shift_labels=s)"
    assert appended("f(a, b,)") == "f(a, b, shift_labels=s,)"
    assert appended("f(\n    a,  # keep\n    b,\n)") == "f(\n    a,  # keep\n    b,\n    shift_labels=s,\n)"
    assert appended("f(\n    a,\n    b,  # last\n)") == "f(\n    a,\n    b,  # last\n    shift_labels=s,\n)"


def test_an_argument_first_spaced_as_the_call_opens():
    first = cst.Arg(value=cst.SimpleString('"cuda"'))
    one = cst.Module([]).code_for_node
    assert one(with_arg_first(cst.parse_expression("f()"), first)) == 'f("cuda")'
    assert one(with_arg_first(cst.parse_expression("f(a)"), first)) == 'f("cuda", a)'
    assert one(with_arg_first(cst.parse_expression("f(\n    a,\n)"), first)) == 'f(\n    "cuda",\n    a,\n)'


def test_summed_parenthesizes_only_what_plus_would_regroup():
    operands = [cst.parse_expression(text) for text in ("a.loss", "0.1 * aux", "x - y", "(p or q)", "-z", "f(x)")]
    assert cst.Module([]).code_for_node(summed(operands)) == "a.loss + 0.1 * aux + (x - y) + (p or q) + (-z) + f(x)"
    assert cst.Module([]).code_for_node(summed([cst.parse_expression("a if b else c")])) == "(a if b else c)"


def test_statements_dropped_hand_their_comments_to_the_next_kept():
    module = cst.parse_module("a()\n# first\nb()  # end\nc()\nd()\n")
    kept = without_statements(list(module.body), {1, 3})
    assert module.with_changes(body=kept).code == "a()\n# first\n# end\nc()\n"
    assert without_statements(list(module.body), set()) == list(module.body)
