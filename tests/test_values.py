"""What value an expression or a launch word has (``lintdist.values``)."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex
from lintdist.values import enum_member, known_value, number_literal, parses_as_bool, python_value, shell_expansion

MIXED = frozenset({"torch.distributed.fsdp.MixedPrecision"})


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


def _keyword(facts: PythonFacts, name: str) -> cst.BaseExpression:
    """The value of the first keyword argument ``name`` in the module."""
    return next(a.value for c in facts.calls for a in c.args if a.keyword is not None and a.keyword.value == name)


def test_known_value_follows_one_assignment_to_a_literal():
    facts = _facts(
        """
        size = 4
        f(a=size, b="x", c=None, d={"k": 1})
        """
    )
    assert python_value(known_value(facts, _keyword(facts, "a"))) == 4
    assert python_value(known_value(facts, _keyword(facts, "b"))) == "x"
    assert python_value(known_value(facts, _keyword(facts, "c"))) is None
    assert isinstance(known_value(facts, _keyword(facts, "d")), cst.Dict)


def test_known_value_is_none_where_the_value_may_vary_or_is_unknown():
    facts = _facts(
        """
        size = 4 if flag else 8
        f(a=size, b=args.size, c=compute())
        """
    )
    assert [known_value(facts, _keyword(facts, n)) for n in "abc"] == [None, None, None]


def test_known_value_reads_torch_enums_and_calls_of_the_given_classes_only():
    facts = _facts(
        """
        from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
        import numpy as np
        f(a=ShardingStrategy.SHARD_GRAD_OP, b=MixedPrecision(), c=np.float32)
        """
    )
    assert enum_member(facts, known_value(facts, _keyword(facts, "a")), "ShardingStrategy") == "SHARD_GRAD_OP"
    assert enum_member(facts, known_value(facts, _keyword(facts, "a")), "StateDictType") is None
    assert known_value(facts, _keyword(facts, "b")) is None
    assert isinstance(known_value(facts, _keyword(facts, "b"), MIXED), cst.Call)
    assert known_value(facts, _keyword(facts, "c")) is None


def test_python_value_of_literals_and_other_nodes():
    assert python_value(cst.parse_expression("True")) is True
    assert python_value(cst.parse_expression("'a' 'b'")) == "ab"
    assert python_value(cst.parse_expression("b'x'")) == "x"
    assert python_value(cst.parse_expression("0x10")) == 16
    node = cst.parse_expression("x.y")
    assert python_value(node) is node
    assert python_value(None) is None


def test_launch_words():
    assert parses_as_bool(False) and parses_as_bool(" Yes ") and parses_as_bool("0")
    assert not parses_as_bool("FULL_SHARD") and not parses_as_bool(2)
    assert shell_expansion("$RESHARD") and shell_expansion("${R:-true}") and shell_expansion("`cat f`")
    assert not shell_expansion("true") and not shell_expansion(True)


def test_truth_follows_names_conditionals_and_helper_parameters():
    from lintdist.values import constant_truth, possible_values, truth

    assert constant_truth(cst.parse_expression("None")) is False
    assert constant_truth(cst.parse_expression("1")) is True
    assert constant_truth(cst.parse_expression("x")) is None
    facts = _facts(
        """
        flag = True
        other = True if a else 1
        mixed = True if a else False
        def build(shuffle):
            return f(s=shuffle)
        build(True)
        build(shuffle=1)
        def unseen(shuffle):
            return g(s=shuffle)
        """
    )
    f_call = next(c for c in facts.calls if getattr(c.func, "value", "") == "f")
    g_call = next(c for c in facts.calls if getattr(c.func, "value", "") == "g")
    assert truth(facts, cst.Name("flag"), f_call) is True
    assert truth(facts, cst.Name("other"), f_call) is True
    assert truth(facts, cst.Name("mixed"), f_call) is None
    assert truth(facts, f_call.args[0].value, f_call) is True
    assert truth(facts, f_call.args[0].value, f_call, parameters=False) is None
    assert truth(facts, g_call.args[0].value, g_call) is None  # no call site: callers out of sight
    assert len(possible_values(facts, f_call.args[0].value, f_call)) == 2


def test_a_number_written_in_the_script():
    facts = _facts(
        """
        if flag:
            same = 1e-3
        else:
            same = 1e-3
        if flag:
            differs = 1e-3
        else:
            differs = 1e-4
        computed = base * 2
        f(3e-4, same, differs, computed, unknown)
        """
    )
    call = facts.calls[-1]
    literal, same, differs, computed, unknown = (a.value for a in call.args)
    assert number_literal(facts, literal, call) == "3e-4"
    assert number_literal(facts, same, call) == "1e-3"
    assert number_literal(facts, differs, call) is None
    assert number_literal(facts, computed, call) is None
    assert number_literal(facts, unknown, call) is None


def test_string_of_a_literal_or_the_one_text_its_assignments_agree_on():
    from lintdist.values import string_of

    facts = _facts(
        """
        url = "tcp://10.0.0.1:23456"
        same = "a" if fast else "a"
        mixed = "a" if fast else "b"
        computed = f"tcp://{host}:{port}"
        use(url, same, mixed, computed, "env://", url_unbound)
        """
    )
    call = next(c for c in facts.calls if facts.method_name(c) == "use")
    texts = [string_of(facts, arg.value, call) for arg in call.args]
    assert texts[0] == "tcp://10.0.0.1:23456" and texts[4] == "env://"
    assert texts[2] is None and texts[3] is None and texts[5] is None
    assert string_of(facts, None, call) is None
