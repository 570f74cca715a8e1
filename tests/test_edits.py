"""lintdist/edits.py: keyword arguments and items appended in the layout of a call or literal."""

from __future__ import annotations

import libcst as cst

from lintdist.edits import keyword_arg, repeatable, with_arg_appended, with_arg_first, with_last_item


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
