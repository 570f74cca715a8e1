"""What a saved state dict is made of and whose it is (lintdist.state_dicts)."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.loop import TrainingLoop
from lintdist.names import NameResolver
from lintdist.state_dicts import (
    loaded_into,
    model_aliases,
    prefix_stripped_when_alone,
    state_dict_calls,
    unwrapped,
)
from lintdist.syntax import SyntaxIndex


def _loop(code: str) -> TrainingLoop:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return TrainingLoop(PythonFacts(index, NameResolver(index)))


def _code(loop: TrainingLoop, node: cst.CSTNode) -> str:
    return loop.facts.index.module.code_for_node(node)


def test_state_dict_calls_in_the_saved_value_and_the_name_it_was_bound_to() -> None:
    loop = _loop(
        """
        checkpoint = {"model": model.state_dict(), "optim": optimizer.state_dict(), "step": step}
        torch.save(checkpoint, "ckpt.pt")
        torch.save(ema.state_dict(), "ema.pt")
        torch.save(load_fn(model.state_dict(prefix="x")), "other.pt")
        """
    )
    facts = loop.facts
    saves = [c for c in facts.calls if facts.method_name(c) == "save"]
    found = [[_code(loop, c) for c in state_dict_calls(facts, loop, s.args[0].value, s)] for s in saves]
    assert found == [["model.state_dict()", "optimizer.state_dict()"], ["ema.state_dict()"], []]


def test_unwrapped_models_through_attributes_calls_and_branches() -> None:
    loop = _loop(
        """
        plain = accelerator.unwrap_model(model)
        if distributed:
            g_module = generator.module
        else:
            g_module = generator
        plain.state_dict()
        g_module.state_dict()
        model.module.state_dict()
        (model.module if ddp else model).state_dict()
        model.state_dict()
        """
    )
    facts = loop.facts
    takes = [c for c in facts.calls if facts.method_name(c) == "state_dict"]
    assert [unwrapped(facts, loop, t.func.value, t) for t in takes] == [True, True, True, True, False]


def test_loaded_into_the_model_or_an_alias_it_was_copied_from() -> None:
    loop = _loop(
        """
        original = model
        model = torch.compile(model)
        wrapped = original
        original.load_state_dict(torch.load("ckpt.pt"))
        torch.save(wrapped.state_dict(), "ckpt.pt")
        torch.save(other.state_dict(), "other.pt")
        restart_from_checkpoint("ckpt.pt", state_dict=net)
        torch.save(net.state_dict(), "net.pt")
        """
    )
    facts = loop.facts
    takes = [c for c in facts.calls if facts.method_name(c) == "state_dict"]
    assert model_aliases(loop, takes[0].func.value, takes[0]) == {"wrapped", "original", "model"}
    assert [loaded_into(facts, loop, t.func.value, t) for t in takes] == ["original", None, "net"]


def test_prefix_stripped_only_in_a_one_process_run() -> None:
    stripped = _loop(
        """
        if local_rank == -1:
            sd = {k[len("module."):]: v for k, v in sd.items()}
        """
    )
    assert prefix_stripped_when_alone(stripped.facts)
    always = _loop('sd = {k[len("module."):]: v for k, v in sd.items()}\n')
    assert not prefix_stripped_when_alone(always.facts)
