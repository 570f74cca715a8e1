"""New items in a bracket, in the bracket's own layout (lintdist/layout.py)."""

from __future__ import annotations

import libcst as cst

from lintdist.layout import appended, equal_like, inserted_after

NEW = cst.Arg(keyword=cst.Name("new"), value=cst.Name("True"))


def _append_arg(text: str) -> str:
    call = cst.parse_expression(text)
    return cst.Module([]).code_for_node(call.with_changes(args=appended(call.args, NEW, call.whitespace_before_args)))


def _insert_arg(text: str, index: int) -> str:
    call = cst.parse_expression(text)
    args = inserted_after(call.args, index, NEW, call.whitespace_before_args)
    return cst.Module([]).code_for_node(call.with_changes(args=args))


def test_appended_to_a_call_on_one_line():
    assert _append_arg("f(a, b=1)") == "f(a, b=1, new = True)"
    assert _append_arg("f()") == "f(new = True)"


def test_appended_to_a_call_one_argument_per_line_keeps_the_trailing_comma():
    assert _append_arg("f(\n    a,\n    b=1,\n)") == "f(\n    a,\n    b=1,\n    new = True,\n)"


def test_appended_to_a_call_one_argument_per_line_without_trailing_comma():
    assert _append_arg("f(\n    a,\n    b=1\n)") == "f(\n    a,\n    b=1,\n    new = True\n)"


def test_appended_to_a_dict_one_element_per_line():
    value = cst.parse_expression('{\n    "a": 1,\n    "b": 2\n}')
    element = cst.DictElement(key=cst.SimpleString('"c"'), value=cst.Integer("3"))
    new = value.with_changes(elements=appended(value.elements, element, value.lbrace.whitespace_after))
    assert cst.Module([]).code_for_node(new) == '{\n    "a": 1,\n    "b": 2,\n    "c": 3\n}'


def test_inserted_after_an_argument_in_the_middle_or_at_the_end():
    assert _insert_arg("f(a=1, b=2, c=3)", 0) == "f(a=1, new = True, b=2, c=3)"
    assert _insert_arg("f(a, b)", 1) == "f(a, b, new = True)"
    # a comment after the argument stays on its line
    assert _insert_arg("f(\n    a=1,  # first\n    b=2,\n)", 0) == "f(\n    a=1,  # first\n    new = True,\n    b=2,\n)"


def test_equal_like_copies_a_keyword_spacing():
    arg = cst.parse_expression("f(steps = 2)").args[0]
    assert equal_like(arg) is arg.equal
    assert equal_like(cst.parse_expression("f(2)").args[0]) is cst.MaybeSentinel.DEFAULT
