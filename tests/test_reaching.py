"""Which assignments of a name reach a point (lintdist/reaching.py)."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.reaching import divided_later, filled_when_missing, reaching_bindings, reads_passed_parameter
from lintdist.syntax import SyntaxIndex


def _facts(source: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(source)))
    return PythonFacts(index, NameResolver(index))


def _use(facts: PythonFacts) -> cst.Call:
    """The ``use(...)`` call of the source."""
    return next(call for call in facts.calls if isinstance(call.func, cst.Name) and call.func.value == "use")


def _reaching(source: str, key: str) -> tuple[list[str], bool]:
    facts = _facts(source)
    bindings, falls_through = reaching_bindings(facts, key, _use(facts))
    return [facts.index.module.code_for_node(b.value) for b in bindings], falls_through


def test_the_last_unconditional_assignment_hides_the_earlier_ones():
    source = """
        def main(args):
            steps = 10
            steps = args.steps * 2
            use(steps)
        """
    assert _reaching(source, "steps") == (["args.steps * 2"], False)


def test_a_conditional_assignment_lets_the_value_from_before_through():
    source = """
        def main(args):
            if args.max_steps is None:
                args.max_steps = epochs * len(loader)
            use(args.max_steps)
        """
    assert _reaching(source, "args.max_steps") == (["epochs * len(loader)"], True)
    before = """
        def main(args):
            steps = 100
            if args.long:
                steps = 1000
            use(steps)
        """
    assert _reaching(before, "steps") == (["1000", "100"], False)


def test_assignments_after_the_point_or_in_other_branches_do_not_reach():
    source = """
        def main(args):
            if args.a:
                steps = 1
            else:
                use(steps)
            steps = 2
        """
    assert _reaching(source, "steps") == ([], True)


def test_a_parameter_that_callers_pass():
    facts = _facts(
        """
        def build(optimizer, total):
            use(total * 2)

        build(optimizer, 100)
        """
    )
    call = _use(facts)
    assert reads_passed_parameter(facts, call.args[0].value, call)
    unused = _facts(
        """
        def build(optimizer, total):
            use(total * 2)
        """
    )
    call = _use(unused)
    assert not reads_passed_parameter(unused, call.args[0].value, call)


def _filled(source: str, key: str) -> str | None:
    facts = _facts(source)
    found = filled_when_missing(facts, key, _use(facts))
    return None if found is None else facts.index.module.code_for_node(found[0].value)


def test_filled_when_missing_is_the_default_a_none_test_fills_in():
    assert (
        _filled("if args.steps is None:\n    args.steps = epochs * n\nuse(args.steps)\n", "args.steps") == "epochs * n"
    )
    assert _filled("if not steps:\n    steps = 10\nuse(steps)\n", "steps") == "10"
    # an `else` gives the value on every path; another test is not about a missing value
    assert _filled("if steps is None:\n    steps = 10\nelse:\n    steps = 5\nuse(steps)\n", "steps") is None
    assert _filled("if steps > 100:\n    steps = 100\nuse(steps)\n", "steps") is None
    assert _filled("steps = 10\nuse(steps)\n", "steps") is None  # nothing from before reaches the use


def test_divided_later_lists_the_divisors_of_a_name_rebound_over_them_after_a_point():
    facts = _facts(
        """
        steps = args.steps // world
        use(steps)
        steps = math.ceil(steps / accelerator.num_processes)
        total = steps / 2
        """
    )
    found = divided_later(facts, "steps", _use(facts))
    assert [facts.index.module.code_for_node(divisor) for divisor, _ in found] == ["accelerator.num_processes"]
