"""The program model's guard splitting: calls that leave a main-process guard, and what may run on every rank
(lintdist.hoist)."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from lintdist.edits import replace_nodes
from lintdist.facts import PythonFacts
from lintdist.hoist import NoHoist, Ordering, helper_repeatable, hoist, is_pure, logs_on_main
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


def _call(facts: PythonFacts, text: str) -> cst.Call:
    module = facts.index.module
    return next(c for c in facts.calls if module.code_for_node(c) == text)


def _guard(facts: PythonFacts) -> cst.If:
    return next(iter(facts.index.nodes(cst.If)))


def _hoisted(code: str, *anchors: str, options=lambda facts: {}) -> str:
    """``code`` with its first ``if`` split so that the calls ``anchors`` run on every rank (``options``: more
    arguments of ``hoist``, made from the facts)."""
    facts = _facts(code)
    guard = _guard(facts)
    statements = hoist(facts, guard, [_call(facts, a) for a in anchors], **options(facts))
    return replace_nodes(facts.index.module, [(guard, cst.FlattenSentinel(statements))]).code


def _why_not(code: str, *anchors: str) -> str:
    facts = _facts(code)
    with pytest.raises(NoHoist) as raised:
        hoist(facts, _guard(facts), [_call(facts, a) for a in anchors])
    return str(raised.value)


def test_the_call_and_its_set_up_leave_the_guard_the_rest_stays_in_place() -> None:
    code = """\
    if accelerator.is_main_process:
        prune(output_dir)
        path = os.path.join(output_dir, "last")
        accelerator.gather(x)
        print(path)
    """
    assert _hoisted(code, "accelerator.gather(x)") == textwrap.dedent(
        """\
        if accelerator.is_main_process:
            prune(output_dir)
        path = os.path.join(output_dir, "last")
        accelerator.gather(x)
        if accelerator.is_main_process:
            print(path)
        """
    )


def test_a_call_that_writes_on_every_rank_after_rank_0_work_gets_a_barrier_first() -> None:
    code = """\
    if accelerator.is_main_process:
        prune(output_dir)
        accelerator.save_state(output_dir)
    """

    def options(facts):
        call = _call(facts, "accelerator.save_state(output_dir)")
        return {"orderings": {id(call): Ordering(writes=True, owner=call.func.value)}}

    assert _hoisted(code, "accelerator.save_state(output_dir)", options=options) == textwrap.dedent(
        """\
        if accelerator.is_main_process:
            prune(output_dir)
        accelerator.wait_for_everyone()
        accelerator.save_state(output_dir)
        """
    )


def test_a_nested_value_is_bound_to_a_new_name_when_bindable() -> None:
    code = """\
    if accelerator.is_main_process:
        model.save_pretrained(d, state_dict=accelerator.get_state_dict(model))
    """
    facts = _facts(code)
    guard = _guard(facts)
    call = _call(facts, "accelerator.get_state_dict(model)")
    statements = hoist(facts, guard, [call], bindable=lambda c: "state_dict")
    assert replace_nodes(facts.index.module, [(guard, cst.FlattenSentinel(statements))]).code == textwrap.dedent(
        """\
        model_state_dict = accelerator.get_state_dict(model)
        if accelerator.is_main_process:
            model.save_pretrained(d, state_dict=model_state_dict)
        """
    )
    assert _why_not(code, "accelerator.get_state_dict(model)") == "the call is part of a larger statement"


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        ("if accelerator.is_main_process:\n    X()\nelse:\n    pass\n", "the guard has an `else` branch"),
        ("if accelerator.is_main_process:\n    if not ok:\n        return\n    X()\n", "leave the block early"),
        ("if accelerator.is_main_process:\n    n = rank + 1\n    X(n)\n", "reads the rank (`rank`)"),
        ("if accelerator.is_main_process:\n    for b in batches:\n        X()\n", "in a `for` block"),
        ("if accelerator.is_main_process:\n    X(); log()\n", "shares its line"),
        ("if accelerator.is_main_process:\n    n = loss.item()\n    X(n)\n", "calls `loss.item()`"),
    ],
)
def test_why_a_guard_cannot_be_split(code: str, reason: str) -> None:
    assert reason in _why_not(code, "X(n)" if "X(n)" in code else "X()")


@pytest.mark.parametrize(
    ("text", "pure"),
    [
        ("os.path.join(a, b)", True),
        ("len(x)", True),
        ("'{}'.format(step)", True),
        ("accelerator.unwrap_model(model)", True),
        ("name.format(step)", False),  # a receiver that may not be a string
        ("loss.item()", False),
        ("open(path)", False),
    ],
)
def test_is_pure(text: str, pure: bool) -> None:
    facts = _facts(f"import os\nx = {text}\n")
    assert is_pure(facts, _call(facts, text)) is pure


def test_a_rebound_builtin_is_not_pure() -> None:
    facts = _facts("len = synced_length\ny = len(x)\n")
    assert not is_pure(facts, _call(facts, "len(x)"))


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ('"""Save."""\n    path = os.path.join(d, "ckpt")\n    X(path)\n    logger.info(path)\n', ""),
        ("X(d)\n    torch.save(sd, d)\n", "also writes files"),
        ("for p in d:\n        X(p)\n", "also does other work"),
    ],
)
def test_helper_repeatable(body: str, reason: str) -> None:
    facts = _facts(f"import os\ndef helper(d):\n    {body}\nhelper(out)\n")

    def allowed(call: cst.Call) -> bool:
        return facts.method_name(call) == "X" or logs_on_main(facts, call)

    found = helper_repeatable(facts, _call(facts, "helper(out)"), allowed)
    assert (reason in found) if reason else found == ""


def test_logs_on_main() -> None:
    facts = _facts("logger.info(x)\naccelerator.print(x)\nprint(x)\nfile.write(x)\nrecords.info(x)\n")
    assert [logs_on_main(facts, c) for c in facts.calls] == [True, True, False, False, False]


def test_binding_stem_names_value_collectives_only():
    from lintdist.hoist import binding_stem

    facts = _facts("x = f(accelerator.get_state_dict(m), accelerator.gather(t))\naccelerator.wait_for_everyone()\n")
    assert binding_stem(facts, _call(facts, "accelerator.get_state_dict(m)")) == "state_dict"
    assert binding_stem(facts, _call(facts, "accelerator.gather(t)")) == "gathered"
    assert binding_stem(facts, _call(facts, "accelerator.wait_for_everyone()")) is None


def test_collective_ordering_barriers_folder_writers_and_their_accelerator():
    from lintdist.hoist import collective_ordering

    facts = _facts(
        """
        from accelerate import Accelerator

        accelerator = Accelerator()
        if accelerator.is_main_process:
            accelerator.wait_for_everyone()
            accelerator.gather(t)
            accelerator.save_state(d)
            checkpoint(args, d)
        """
    )
    guard = _guard(facts)
    assert collective_ordering(facts, _call(facts, "accelerator.wait_for_everyone()"), None, guard).barrier
    assert collective_ordering(facts, _call(facts, "accelerator.gather(t)"), None, guard) == Ordering()
    saved = collective_ordering(facts, _call(facts, "accelerator.save_state(d)"), None, guard)
    assert saved.writes and cst.Module([]).code_for_node(saved.owner) == "accelerator"
    # reached through a helper call: the guard's own Accelerator is in scope there
    via = _call(facts, "checkpoint(args, d)")
    through = collective_ordering(facts, _call(facts, "accelerator.save_state(d)"), via, guard)
    assert through.writes and cst.Module([]).code_for_node(through.owner) == "accelerator"


def test_split_guard_gives_the_outer_guard_and_its_statements_or_why_not():
    from lintdist.hoist import split_guard

    code = """
        from accelerate import Accelerator

        accelerator = Accelerator()
        for batch in loader:
            if accelerator.is_main_process:
                losses = accelerator.gather(loss)
                print(losses.mean())
        """
    facts = _facts(code)
    guard = _guard(facts)
    outer, statements = split_guard(facts, guard, [_call(facts, "accelerator.gather(loss)")], {})
    assert outer is guard
    fixed = replace_nodes(facts.index.module, [(outer, cst.FlattenSentinel(statements))]).code
    assert "    losses = accelerator.gather(loss)\n    if accelerator.is_main_process:\n" in fixed
    facts = _facts("@accelerator.on_main_process\ndef report():\n    accelerator.gather(loss)\n")
    call = _call(facts, "accelerator.gather(loss)")
    with pytest.raises(NoHoist, match="decorator"):
        split_guard(facts, facts.rank_guard(call), [call], {})
