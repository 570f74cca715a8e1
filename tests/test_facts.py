"""The facts' questions that several rules ask: each answered once here, tested on small scripts."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts, epoch_counter, single_pass
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


def _call(facts: PythonFacts, text: str) -> cst.Call:
    """The first call whose callee reads ``text``."""
    module = facts.index.module
    return next(c for c in facts.calls if module.code_for_node(c.func) == text)


# -- the Accelerator as spelled at a point -------------------------------------------------------


def test_accelerator_used_in_the_same_function_is_named_as_written():
    facts = _facts(
        """
        from accelerate import Accelerator

        def main():
            accelerator = Accelerator()
            model = accelerator.prepare(model)
            torch.save(model.state_dict(), "m.pt")
        """
    )
    assert facts.accelerator_at(_call(facts, "torch.save")) == "accelerator"


def test_accelerator_known_by_an_accelerate_only_method_it_is_called_with():
    facts = _facts(
        """
        from accelerate import Accelerator

        def setup():
            return Accelerator()

        def run(model):
            acc = setup()
            with acc.autocast():
                pass
            torch.save(model, "m.pt")
        """
    )
    assert facts.accelerator_at(_call(facts, "torch.save")) == "acc"


def test_accelerator_in_a_method_is_the_attribute_the_class_sets():
    facts = _facts(
        """
        from accelerate import Accelerator

        class Runner:
            def __init__(self):
                self.accelerator = Accelerator()

            def save(self, model):
                torch.save(model.state_dict(), "m.pt")

            @staticmethod
            def export(model):
                torch.save(model, "x.pt")
        """
    )
    saves = [c for c in facts.calls if facts.index.module.code_for_node(c.func) == "torch.save"]
    assert facts.accelerator_at(saves[0]) == "self.accelerator"
    assert facts.accelerator_at(saves[1]) is None  # a static method has no `self`


def test_a_module_level_accelerator_is_seen_from_a_function_unless_it_rebinds_the_name():
    facts = _facts(
        """
        from accelerate import Accelerator

        accelerator = Accelerator()

        def save(model):
            torch.save(model.state_dict(), "m.pt")

        def other(model):
            accelerator = make()
            torch.save(model, "x.pt")
        """
    )
    saves = [c for c in facts.calls if facts.index.module.code_for_node(c.func) == "torch.save"]
    assert facts.accelerator_at(saves[0]) == "accelerator"
    assert facts.accelerator_at(saves[1]) is None


def test_an_accelerator_known_by_its_module_level_use_is_seen_from_a_function():
    facts = _facts(
        """
        from lib import acc

        acc.wait_for_everyone()
        if acc.is_main_process:
            acc.save_state("ckpt")

        def save(model):
            torch.save(model, "x.pt")
        """
    )
    assert facts.accelerator_at(_call(facts, "torch.save")) == "acc"


def test_an_accelerator_used_only_inside_a_function_is_not_in_sight_at_module_level():
    facts = _facts(
        """
        from accelerate import Accelerator

        def main():
            accelerator = Accelerator()
            accelerator.wait_for_everyone()

        torch.save(model, "x.pt")
        """
    )
    assert facts.accelerator_at(_call(facts, "torch.save")) is None


# -- how the file spells torch.distributed ---------------------------------------------------------


def _distributed(code: str) -> str | None:
    facts = _facts(code)
    return facts.distributed_at(_call(facts, "save"))


def test_distributed_is_spelled_by_its_import_alias():
    assert _distributed("import torch\nimport torch.distributed as dist\nsave()\n") == "dist"
    assert _distributed("from torch import distributed as d\nsave()\n") == "d"
    assert _distributed("from torch import distributed\nsave()\n") == "distributed"


def test_distributed_is_reached_through_torch_when_no_alias_is_imported():
    assert _distributed("import torch\nsave()\n") == "torch.distributed"
    assert _distributed("import torch as th\nsave()\n") == "th.distributed"
    assert _distributed("import torch.nn as nn\nsave()\n") == "torch.distributed"
    assert _distributed("import os\nsave()\n") is None


def test_an_alias_wins_over_torch_wherever_it_is_imported():
    assert _distributed("import torch\nimport os\nimport torch.distributed as dist\nsave()\n") == "dist"
    assert _distributed("import torch as th\nfrom torch import distributed as dist\nsave()\n") == "dist"


def test_an_import_inside_another_function_is_not_in_sight():
    code = """
    import torch

    def setup():
        import torch.distributed as dist
        dist.init_process_group("nccl")

    def main():
        save()
    """
    assert _distributed(code) == "torch.distributed"
    inside = """
    def main():
        import torch.distributed as dist
        save()
    """
    assert _distributed(inside) == "dist"


# -- is this name read -------------------------------------------------------------------------------


def _names(facts: PythonFacts, value: str) -> list[cst.Name]:
    return [n for n in facts.index.nodes(cst.Name) if n.value == value]


def test_a_name_is_read_where_its_value_is_used():
    facts = _facts(
        """
        sd = load()
        print(sd)
        sd += 1
        model.sd.x = f(sd=sd)
        """
    )
    names = _names(facts, "sd")
    # bound, read, read and rebound (`+=`), the attribute `.sd`, the keyword `sd=`, the argument
    assert [facts.is_read(n) for n in names] == [False, True, True, False, False, True]
    assert [facts.is_variable(n) for n in names] == [True, True, True, False, False, True]


def test_binding_forms_are_not_reads():
    facts = _facts(
        """
        import a.sd
        from b import sd
        import c as sd
        a, (sd, *rest) = pair
        for sd in items:
            pass
        with open(p) as sd:
            pass
        try:
            pass
        except OSError as sd:
            pass
        ys = [sd for sd in xs]
        if (sd := f()):
            pass
        del sd
        def sd(sd, *, other=sd):
            global sd
        class sd:
            pass
        """
    )
    reads = [n for n in _names(facts, "sd") if facts.is_read(n)]
    # only the comprehension's element and the parameter default read a value
    assert [facts.index.module.code_for_node(facts.parent(n)).strip()[:12] for n in reads] == [
        "[sd for sd i",
        "other=sd",
    ]
    imported_a = _names(facts, "a")[0]  # the `a` of `import a.sd`
    assert isinstance(facts.parent(imported_a), cst.Attribute) and not facts.is_read(imported_a)


def test_reads_of_a_name_inside_a_scope():
    facts = _facts(
        """
        def main():
            state = convert()
            for state in states:
                pass

        def other():
            print(state)
        """
    )
    main = next(f for f in facts.index.nodes(cst.FunctionDef) if f.name.value == "main")
    assert facts.reads_of("state", main) == []
    assert len(facts.reads_of("state", facts.index.module)) == 1


# -- Lightning -------------------------------------------------------------------------------------


def test_a_lightning_module_is_known_under_every_import_home_and_through_local_bases():
    facts = _facts(
        """
        from pytorch_lightning.core.lightning import LightningModule
        import lightning as L

        class Old(LightningModule):
            def training_step(self, batch, batch_idx):
                return loss

        class Base(L.LightningModule):
            pass

        class Child(Base):
            def training_step(self, batch, batch_idx):
                def inner():
                    return 1
                return inner()

            x = compute()

        class Plain:
            def training_step(self, batch, batch_idx):
                return loss
        """
    )
    classes = {cls.name.value: cls for cls in facts.classes}
    assert [name for name, cls in classes.items() if facts.is_lightning_module(cls)] == ["Old", "Base", "Child"]
    code = facts.index.module.code_for_node
    inner_return = next(r for r in facts.index.nodes(cst.Return) if code(r).strip() == "return 1")
    assert facts.lightning_module_of(inner_return) is classes["Child"]
    plain_step = next(f for f in facts.functions["training_step"] if facts.enclosing_class(f) is classes["Plain"])
    assert facts.lightning_module_of(facts.returns[plain_step][0]) is None
    class_body_call = _call(facts, "compute")
    assert facts.lightning_module_of(class_body_call) is None  # in the class body, not in a method


def _devices(arguments: str, before: str = "") -> str | None:
    facts = _facts(f"import lightning as L\n{before}\ntrainer = L.Trainer({arguments})\n")
    (trainer,) = facts.lightning_trainers
    return facts.trainer_devices(trainer)


def test_a_trainer_on_one_device():
    assert _devices("devices=1") == "one"
    assert _devices('devices="1", num_nodes=1') == "one"
    assert _devices("devices=[0]") == "one"
    assert _devices("devices=n", before="n = min(1, torch.cuda.device_count())") == "one"
    assert _devices('accelerator="cpu"') == "one"
    assert _devices('devices=1, strategy="ddp"') == "one"  # one process: nothing to average


def test_a_trainer_on_several_devices():
    assert _devices("devices=4") == "several"
    assert _devices("devices=[0, 1]") == "several"
    assert _devices("devices=1, num_nodes=2") == "several"
    assert _devices("devices=gpus", before="gpus = 8") == "several"
    assert _devices('strategy="fsdp"') == "several"
    assert _devices("devices=4, **extra") == "several"


def test_a_trainer_whose_devices_are_not_known():
    assert _devices("") is None
    assert _devices("devices=args.gpus") is None
    assert _devices('devices="auto"') is None
    assert _devices("devices=1, **extra") is None  # `extra` may hold num_nodes
    assert _devices("devices=-1") is None


def test_trainers_are_found_under_every_import_home():
    facts = _facts(
        """
        import pytorch_lightning as pl
        from lightning.pytorch.trainer.trainer import Trainer

        a = pl.Trainer()
        b = Trainer(devices=2)
        c = Other()
        """
    )
    assert [facts.index.module.code_for_node(c.func) for c in facts.lightning_trainers] == ["pl.Trainer", "Trainer"]


# -- epoch loops -------------------------------------------------------------------------------------


def _loop(code: str):
    return _facts(code).loops[0]


def test_a_loop_over_one_element_or_range_1_is_a_single_pass():
    assert single_pass(_loop("for epoch in range(1):\n    train()\n"))
    assert single_pass(_loop("for epoch in [0]:\n    train()\n"))
    assert not single_pass(_loop("for epoch in range(epochs):\n    train()\n"))
    assert not single_pass(_loop("for epoch in range(2):\n    train()\n"))
    assert not single_pass(_loop("while True:\n    train()\n"))


def test_the_epoch_counter_is_the_for_target_or_a_while_loops_increment():
    assert epoch_counter(_loop("for epoch in range(3):\n    train()\n")) == "epoch"
    assert epoch_counter(_loop("for _ in range(3):\n    train()\n")) is None
    assert epoch_counter(_loop("for i, batch in enumerate(loader):\n    train()\n")) is None
    assert epoch_counter(_loop("while epoch < n:\n    train()\n    epoch += 1\n")) == "epoch"
    assert epoch_counter(_loop("while epoch < n:\n    epoch += 2\n")) is None


# -- elements and items -------------------------------------------------------------------------


def _name_at(facts: PythonFacts, call_text: str, position: int = 0) -> cst.BaseExpression:
    """The ``position``-th argument of the first call whose callee reads ``call_text``."""
    return _call(facts, call_text).args[position].value


def test_an_element_taken_by_position_is_the_element_an_unpacking_would_take():
    facts = _facts(
        """
        from accelerate import Accelerator

        def main(net, loader):
            accelerator = Accelerator()
            parts = accelerator.prepare(net, loader)
            net = parts[0]
            pair = (make_encoder(), make_decoder())
            decoder = pair[1]
            keep(net, decoder)
        """
    )
    code = facts.index.module.code_for_node
    keep = _call(facts, "keep")
    net, decoder = (a.value for a in keep.args)
    [origin] = facts.origins(net, keep)
    assert (code(origin.node), origin.index) == ("accelerator.prepare(net, loader)", 0)
    assert [code(o.node) for o in facts.origins(decoder, keep)] == ["make_decoder()"]


def test_a_slice_or_a_computed_index_is_not_an_element():
    facts = _facts(
        """
        def main(parts, i):
            parts = build()
            first = parts[i]
            rest = parts[1:]
            keep(first, rest)
        """
    )
    keep = _call(facts, "keep")
    code = facts.index.module.code_for_node
    assert [code(o.node) for a in keep.args for o in facts.origins(a.value, keep)] == ["parts[i]", "parts[1:]"]


def test_storing_an_item_does_not_rebind_the_container():
    facts = _facts(
        """
        import torch

        def export(model, path):
            weights = model.state_dict()
            for name, tensor in weights.items():
                weights[name] = tensor.cpu()
            torch.save(weights, path)
        """
    )
    code = facts.index.module.code_for_node
    save = _call(facts, "torch.save")
    assert [code(o.node) for o in facts.origins(_name_at(facts, "torch.save"), save)] == ["model.state_dict()"]
    assert [b.key for b in facts.bindings("weights", save)] == ["weights"]
