"""What code does to gradients (lintdist/gradients.py): no_grad, freezing, detaching."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.gradients import (
    context_callee,
    enters_no_grad,
    flows_into,
    freezes,
    freezes_call,
    gradient_sources,
    runs_in_step,
    sets_requires_grad,
    under_detach,
)
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _facts(source: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(source)))
    return PythonFacts(index, NameResolver(index))


def _call(facts: PythonFacts, name: str) -> cst.Call:
    code = facts.index.module.code_for_node
    return next(c for c in facts.index.nodes(cst.Call) if code(c.func) == name)


def test_enters_no_grad():
    facts = _facts(
        """
        import torch
        with torch.no_grad():
            pass
        with torch.inference_mode(), lock:
            pass
        with torch.enable_grad():
            pass
        """
    )
    withs = facts.index.nodes(cst.With)
    assert [enters_no_grad(facts, w) for w in withs] == [True, True, False]
    code = facts.index.module.code_for_node
    assert code(context_callee(withs[1].items[1])) == "lock"


def test_freezes_a_parameter():
    def statement(text: str) -> cst.BaseSmallStatement:
        return cst.parse_statement(text).body[0]

    assert freezes(statement("p.requires_grad = False"))
    assert not freezes(statement("p.requires_grad = True"))
    assert not freezes(statement("requires_grad = False"))


def test_freezes_call_directly_or_through_a_helper():
    facts = _facts(
        """
        def set_requires_grad(nets, requires_grad=False):
            for net in nets:
                for p in net.parameters():
                    p.requires_grad = requires_grad

        def toggle(model, flag):
            model.requires_grad_(flag)

        class GAN:
            def freeze(self, model, flag):
                model.requires_grad_(flag)

            def step(self):
                self.freeze(disc, False)

        disc.requires_grad_(False)
        disc.requires_grad_(True)
        set_requires_grad([disc])
        set_requires_grad([disc], True)
        toggle(disc, False)
        toggle(disc, flag)
        log(disc, False)
        """
    )
    calls = [c for c in facts.index.nodes(cst.Call) if isinstance(c.func, (cst.Name, cst.Attribute))]
    code = facts.index.module.code_for_node
    answers = {code(c): freezes_call(facts, c) for c in calls}
    assert answers["disc.requires_grad_(False)"]
    assert not answers["disc.requires_grad_(True)"]
    assert answers["set_requires_grad([disc])"]  # the default is False
    assert not answers["set_requires_grad([disc], True)"]
    assert answers["toggle(disc, False)"]
    assert not answers["toggle(disc, flag)"]
    assert not answers["log(disc, False)"]
    assert answers["self.freeze(disc, False)"]  # `self` is not a parameter the call passes


def test_sets_requires_grad_from_a_parameter():
    facts = _facts("def f(m, flag, other):\n    m.requires_grad_(flag)\n    m.requires_grad = other\n")
    function = facts.index.nodes(cst.FunctionDef)[0]
    assert sets_requires_grad(facts, function, "flag")
    assert sets_requires_grad(facts, function, "other")
    assert not sets_requires_grad(facts, function, "m")


def test_under_detach():
    facts = _facts("loss = critic(fake.detach()) + critic(real)\n")
    value = facts.index.nodes(cst.Assign)[0].value
    fake, real = (n for n in facts.within(value, cst.Name) if n.value in {"fake", "real"})
    assert under_detach(facts, fake, value)
    assert not under_detach(facts, real, value)
    assert not under_detach(facts, _call(facts, "critic"), value)


def test_runs_in_step_skips_nested_definitions_and_no_grad():
    facts = _facts(
        """
        import torch
        with acc.accumulate(model):
            a()
            with torch.no_grad():
                b()
            def helper():
                c()
            f = lambda: d()
            if x:
                e()
        """
    )
    block = facts.index.nodes(cst.With)[0]
    code = facts.index.module.code_for_node
    runs = {code(c.func): runs_in_step(facts, c, block) for c in facts.within(block.body, cst.Call)}
    assert runs == {"a": True, "torch.no_grad": False, "b": False, "c": False, "d": False, "e": True}


def test_gradient_sources_follow_earlier_assignments_not_detached_ones():
    facts = _facts(
        """
        with acc.accumulate(model):
            fake = gen(z)
            score = disc(fake)
            frozen = disc(fake.detach())
            loss = crit(score) + frozen.mean()
            acc.backward(loss)
            late = other(x)
        """
    )
    block = facts.index.nodes(cst.With)[0]
    backward = _call(facts, "acc.backward")
    sources = gradient_sources(facts, backward.args[0].value, block.body, backward)
    code = facts.index.module.code_for_node
    assert sorted(code(s) for s in sources) == sorted(
        ["loss", "crit(score) + frozen.mean()", "disc(fake)", "gen(z)", "disc(fake.detach())"]
    )
    assert any(flows_into(facts, _call(facts, "gen"), s) for s in sources)
    assert not flows_into(facts, _call(facts, "other"), sources[0])
    frozen = next(s for s in sources if code(s) == "disc(fake.detach())")
    inner = facts.within(frozen, cst.Name)[1]  # `fake`, read through `.detach()`
    assert inner.value == "fake" and not flows_into(facts, inner, frozen)
