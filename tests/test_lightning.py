"""Lightning questions of ``lintdist.lightning``: the Trainer that fits a module, the loss a step returns."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.lightning import (
    accumulated_batches,
    fitting_trainers,
    in_training_branch,
    is_training_stage_test,
    names_training_stage,
    optimizes_manually,
    per_rank_log_value,
    returned_loss,
    running_hooks,
    runs_on_one_device,
    scales_loss,
)
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


def _class(facts: PythonFacts, name: str) -> cst.ClassDef:
    return next(c for c in facts.classes if c.name.value == name)


def test_the_trainer_that_fits_the_module():
    facts = _facts(
        """
        import lightning as L
        class A(L.LightningModule):
            pass
        class B(L.LightningModule):
            pass
        slow = L.Trainer(accumulate_grad_batches=4)
        fast = L.Trainer()
        slow.fit(A())
        model = B()
        fast.fit(model)
        """
    )
    slow, fast = facts.lightning_trainers
    assert fitting_trainers(facts, _class(facts, "A")) == [slow]
    assert fitting_trainers(facts, _class(facts, "B")) == [fast]


def test_the_one_trainer_when_no_fit_links_one():
    facts = _facts("import lightning as L\nclass A(L.LightningModule):\n    pass\ntrainer = L.Trainer()\n")
    assert fitting_trainers(facts, _class(facts, "A")) == facts.lightning_trainers
    two = _facts("import lightning as L\nclass A(L.LightningModule):\n    pass\nL.Trainer()\nL.Trainer()\n")
    assert fitting_trainers(two, _class(two, "A")) == []


def test_returned_loss():
    loss = cst.parse_expression("loss")
    assert returned_loss(loss) is loss
    code = cst.Module([]).code_for_node
    assert code(returned_loss(cst.parse_expression('{"log": x, "loss": total / n}'))) == "total / n"
    assert returned_loss(cst.parse_expression('{"log": x, key: y}')) is None


def test_manual_optimization_by_the_attribute_or_in_a_method():
    facts = _facts(
        """
        import lightning as L

        class Manual(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.automatic_optimization = False

        class ByClass(L.LightningModule):
            automatic_optimization = False

        class Automatic(L.LightningModule):
            def __init__(self):
                self.automatic_optimization = True
        """
    )
    assert optimizes_manually(facts, _class(facts, "Manual"))
    assert optimizes_manually(facts, _class(facts, "ByClass"))
    assert not optimizes_manually(facts, _class(facts, "Automatic"))


def test_a_trainer_scales_the_loss_under_fp16_or_deepspeed():
    def scaled(trainer: str) -> bool:
        return scales_loss(
            _facts(f"import lightning as L\nfrom lightning.pytorch.strategies import DeepSpeedStrategy\n{trainer}\n")
        )

    assert scaled('L.Trainer(precision="16-mixed")')
    assert scaled("L.Trainer(precision=16)")
    assert scaled('L.Trainer(strategy="deepspeed_stage_2")')
    assert scaled("L.Trainer(strategy=DeepSpeedStrategy(stage=3))")
    assert not scaled('L.Trainer(precision="bf16-mixed", strategy="ddp")')


def _method(facts: PythonFacts, name: str) -> cst.FunctionDef:
    return facts.functions[name][0]


def test_the_hooks_that_run_a_helper_method():
    facts = _facts(
        """
        import lightning as L
        class Base(L.LightningModule):
            def _shared(self, batch):
                return self._deeper(batch)
            def _deeper(self, batch):
                return batch
            def _unused(self):
                pass
        class Model(Base):
            def validation_step(self, batch, i):
                return self._shared(batch)
            def training_step(self, batch, i):
                def inner():
                    return self._shared(batch)
                return inner()
        """
    )
    assert running_hooks(facts, _method(facts, "validation_step")) == {"validation_step"}
    assert running_hooks(facts, _method(facts, "_deeper")) == {"validation_step", "training_step"}
    assert running_hooks(facts, _method(facts, "_unused")) == set()


def test_one_device_only_when_every_trainer_says_so():
    assert runs_on_one_device(_facts("import lightning as L\nL.Trainer(devices=1)\nL.Trainer(accelerator='cpu')\n"))
    assert not runs_on_one_device(_facts("import lightning as L\nL.Trainer(devices=1)\nL.Trainer(devices=2)\n"))
    assert not runs_on_one_device(_facts("import lightning as L\n"))


def test_the_training_stage_by_name_and_by_test():
    assert names_training_stage(cst.parse_expression('"Train_loss"'))
    assert names_training_stage(cst.parse_expression('f"train/{k}"'))
    assert not names_training_stage(cst.parse_expression('f"{stage}_train"'))
    assert not names_training_stage(cst.parse_expression("name"))
    assert is_training_stage_test(cst.parse_expression("self.training"))
    assert is_training_stage_test(cst.parse_expression('stage == "train"'))
    assert is_training_stage_test(cst.parse_expression('"train" in mode'))
    assert not is_training_stage_test(cst.parse_expression('stage != "train"'))
    assert not is_training_stage_test(cst.parse_expression('stage == "val"'))


def test_which_logged_values_differ_between_ranks():
    facts = _facts(
        """
        import torchmetrics
        from torchmetrics.functional import accuracy
        def step(self, batch, param):
            loss = self(batch).mean()
            acc = accuracy(self(batch), batch)
            metric = torchmetrics.Accuracy(task="binary")
            log(loss, loss.item(), acc, metric, self.val_acc, self.val_acc.compute(), float(self.current_epoch), param, 3)
            log({"a": loss, "b": 1}, {"e": self.current_epoch})
        """
    )
    first, second = [c for c in facts.calls if facts.method_name(c) == "log"]
    values = [per_rank_log_value(facts, a.value, first) for a in first.args]
    assert values == [True, True, True, False, False, False, False, False, False]
    assert [per_rank_log_value(facts, a.value, second, mapping=True) for a in second.args] == [True, False]


def test_the_training_branch_inside_a_method():
    facts = _facts(
        """
        def shared(self, batch, stage):
            if stage == "train":
                log("a")
            else:
                log("b")
            if self.training:
                if x:
                    log("c")
            log("d")
        """
    )
    method = _method(facts, "shared")
    logs = {c.args[0].value.evaluated_value: in_training_branch(facts, c, method) for c in facts.calls}
    assert logs == {"a": True, "b": False, "c": True, "d": False}


def test_accumulated_batches_literal_above_one_as_written():
    def batches(text: str) -> str | None:
        return accumulated_batches(cst.parse_expression(text))

    assert batches("L.Trainer(accumulate_grad_batches=4)") == "4"
    assert batches("L.Trainer(max_epochs=2, accumulate_grad_batches=1)") is None
    assert batches("L.Trainer(accumulate_grad_batches=args.accum)") is None
    assert batches("L.Trainer(**cfg, accumulate_grad_batches=4)") is None  # a mapping before it may say anything
    assert batches("L.Trainer()") is None
