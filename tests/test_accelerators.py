"""What goes through an Accelerator's prepare, and the options its construction gives (lintdist/accelerators.py)."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.accelerators import UNKNOWN, accelerator_calls, accelerator_option, prepared_arguments
from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _facts(source: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(source)))
    return PythonFacts(index, NameResolver(index))


def _options(source: str, *names: str) -> list[object]:
    """The options of the Accelerator behind the file's (last) prepare call."""
    facts = _facts(source)
    prepare = [call for call, _, _ in prepared_arguments(facts)][-1]
    (accelerator,) = accelerator_calls(facts, prepare.func.value, prepare)
    return [accelerator_option(facts, accelerator, name) for name in names]


def test_prepared_arguments_pair_each_argument_with_its_target():
    facts = _facts(
        """
        from accelerate import Accelerator
        accelerator = Accelerator()
        model, optimizer, scheduler = accelerator.prepare(model, optimizer, make_scheduler())
        lr_scheduler = accelerator.prepare_scheduler(lr_scheduler)
        first, rest = accelerator.prepare(a, b, c)
        accelerator.prepare(*parts)
        other.prepare(x)
        """
    )
    code = facts.index.module.code_for_node
    found = [(code(argument), target) for _, argument, target in prepared_arguments(facts)]
    assert found == [
        ("model", "model"),
        ("optimizer", "optimizer"),
        ("make_scheduler()", "scheduler"),
        ("lr_scheduler", "lr_scheduler"),
        ("a", None),
        ("b", None),
        ("c", None),
    ]


def test_defaults_when_nothing_is_said():
    source = """
        from accelerate import Accelerator
        accelerator = Accelerator(mixed_precision="bf16")
        model = accelerator.prepare(model)
        """
    assert _options(source, "step_scheduler_with_optimizer", "split_batches") == [True, False]


def test_literal_keywords_and_the_dataloader_configuration():
    source = """
        from accelerate import Accelerator, DataLoaderConfiguration
        config = DataLoaderConfiguration(split_batches=True)
        accelerator = Accelerator(step_scheduler_with_optimizer=False, dataloader_config=config)
        model = accelerator.prepare(model)
        """
    assert _options(source, "step_scheduler_with_optimizer", "split_batches") == [False, True]


def test_split_batches_given_to_the_accelerator_itself_is_not_read():
    source = """
        from accelerate import Accelerator
        accelerator = Accelerator(split_batches=True)
        model = accelerator.prepare(model)
        """
    assert _options(source, "split_batches") == [False]


def test_expressions_and_unreadable_configurations_are_unknown():
    source = """
        from accelerate import Accelerator

        def main(args, config):
            accelerator = Accelerator(step_scheduler_with_optimizer=args.step_with_optimizer, dataloader_config=config)
            model = accelerator.prepare(model)
        """
    assert _options(source, "step_scheduler_with_optimizer", "split_batches") == [UNKNOWN, UNKNOWN]
    positional = """
        from accelerate import Accelerator, DataLoaderConfiguration
        accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(False, **more))
        model = accelerator.prepare(model)
        """
    assert _options(positional, "split_batches") == [UNKNOWN]


def test_a_kwargs_dict_with_known_keys_hides_nothing():
    source = """
        from accelerate import Accelerator
        accelerator_kwargs = {"gradient_accumulation_steps": 4}
        accelerator_kwargs["log_with"] = "wandb"
        accelerator = Accelerator(**accelerator_kwargs)
        model = accelerator.prepare(model)
        """
    assert _options(source, "step_scheduler_with_optimizer", "split_batches") == [True, False]


def test_a_kwargs_dict_that_may_set_the_option_is_unknown():
    keyed = """
        from accelerate import Accelerator
        kwargs = {}
        kwargs["dataloader_config"] = config
        accelerator = Accelerator(**kwargs)
        model = accelerator.prepare(model)
        """
    assert _options(keyed, "step_scheduler_with_optimizer", "split_batches") == [True, UNKNOWN]
    updated = """
        from accelerate import Accelerator
        kwargs = dict()
        kwargs.update(options)
        accelerator = Accelerator(**kwargs)
        model = accelerator.prepare(model)
        """
    assert _options(updated, "step_scheduler_with_optimizer") == [UNKNOWN]
    unseen = """
        from accelerate import Accelerator
        def main(kwargs):
            accelerator = Accelerator(**kwargs)
            model = accelerator.prepare(model)
        """
    assert _options(unseen, "split_batches") == [UNKNOWN]


def test_prepared_loaders_and_accelerator_receivers():
    from lintdist.accelerators import accelerator_receiver, prepared_loaders

    source = """
    from accelerate import Accelerator
    from accelerate.data_loader import prepare_data_loader
    accelerator = Accelerator()
    model, loader = accelerator.prepare(model, loader, kw=x)
    prepare_data_loader(other)
    self.accelerator.prepare_data_loader(third)
    tokenizer.prepare(text)
    """
    text = textwrap.dedent(source)
    facts = _facts(source)
    found = [[cst.Module([]).code_for_node(e) for e in prepared_loaders(facts, c, text)] for c in facts.calls]
    assert [f for f in found if f] == [["model", "loader"], ["other"], ["third"]]
    receiver = cst.parse_expression("self.accelerator")
    assert accelerator_receiver(facts, receiver, facts.calls[0], text)
    assert not accelerator_receiver(facts, receiver, facts.calls[0], "import torch\n")


def test_even_batches_off_by_store_join_or_setting():
    from lintdist.accelerators import even_batches_off

    assert not even_batches_off(_facts("accelerator.even_batches = True\n"), None)
    assert even_batches_off(_facts("accelerator.even_batches = flag\n"), None)
    assert even_batches_off(
        _facts("with accelerator.join_uneven_inputs([model], even_batches=False):\n    pass\n"), None
    )
    assert not even_batches_off(_facts("with accelerator.join_uneven_inputs([model]):\n    pass\n"), None)


def test_accelerator_methods_and_spelling():
    from lintdist.accelerators import accelerator_methods, accelerator_spelling

    facts = _facts(
        """
        from accelerate import Accelerator
        accelerator = Accelerator()
        accelerator.wait_for_everyone()

        class Trainer:
            def __init__(self):
                self.accelerator = Accelerator()

            def step(self, loss):
                self.accelerator.backward(loss)
                torch.cuda.synchronize()
                return loss

        def helper(x):
            return x + 1
        """
    )
    functions = {f.name.value: f for f in facts.index.nodes(cst.FunctionDef)}
    step, helper = functions["step"], functions["helper"]
    assert [facts.method_name(c) for c in accelerator_methods(facts, step)] == ["backward"]
    assert accelerator_methods(facts, helper) == []
    assert accelerator_spelling(facts, step.body) == "self.accelerator"
    assert accelerator_spelling(facts, helper.body) == "accelerator"  # the module's own statements


def test_loose_dataloader_keywords_are_the_options_outside_the_configuration():
    import libcst as cst

    from lintdist.accelerators import loose_dataloader_keywords

    call = cst.parse_expression(
        "Accelerator(split_batches=True, cpu=True, even_batches=x, dataloader_config=DataLoaderConfiguration(dispatch_batches=False))"
    )
    assert [arg.keyword.value for arg in loose_dataloader_keywords(call)] == ["split_batches", "even_batches"]
    assert loose_dataloader_keywords(cst.parse_expression("Accelerator(**kwargs)")) == []


def test_dataloader_keys_in_kwargs_are_read_from_the_unpacked_dicts():
    from lintdist.accelerators import dataloader_keys_in_kwargs
    from lintdist.facts import ACCELERATOR_CLASSES

    facts = _facts(
        """
        from accelerate import Accelerator
        first = dict(mixed_precision="bf16", dispatch_batches=False)
        second = {"even_batches": False, "cpu": True}
        third = {}
        third["split_batches"] = True
        a = Accelerator(**first)
        b = Accelerator(**second)
        c = Accelerator(**third)
        """
    )
    calls = [call for call in facts.calls if facts.callee_is(call, ACCELERATOR_CLASSES)]
    found = [dataloader_keys_in_kwargs(facts, call) for call in calls]
    assert [key.keyword.value for key in found[0]] == ["dispatch_batches"]
    assert [key.evaluated_value for key in found[1]] == ["even_batches"]
    assert found[2] == []  # a store is left alone: scripts guard it by the installed signature
