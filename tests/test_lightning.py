"""Lightning questions of ``lintdist.lightning``: the Trainer that fits a module, the loss a step returns."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.lightning import fitting_trainers, optimizes_manually, returned_loss, scales_loss
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
