"""lintdist/labels.py: Trainers that use their model's own loss, calls that hand labels, the head a call runs."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.labels import batch_holds, called_head, hands_labels, may_call_model, model_loss_trainer
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


def _call(facts: PythonFacts, text: str) -> cst.Call:
    return next(c for c in facts.calls if facts.index.module.code_for_node(c.func) == text)


def test_trainers_that_train_on_the_model_loss():
    facts = _facts(
        """
        from transformers import Trainer
        import trl
        class Plain(Trainer):
            pass
        class Custom(Trainer):
            def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
                return 0
        Trainer(model=m)
        trl.SFTTrainer(model=m)
        Plain(model=m)
        Custom(model=m)
        Runner(model=m)
        """
    )
    assert model_loss_trainer(facts, _call(facts, "Trainer"))
    assert model_loss_trainer(facts, _call(facts, "trl.SFTTrainer"))
    assert model_loss_trainer(facts, _call(facts, "Plain"))
    assert not model_loss_trainer(facts, _call(facts, "Custom"))
    assert not model_loss_trainer(facts, _call(facts, "Runner"))


def test_calls_that_hand_labels():
    assert hands_labels(cst.parse_expression("model(input_ids=x, labels=y)"))
    assert hands_labels(cst.parse_expression("model(**batch)"))
    assert not hands_labels(cst.parse_expression("model(*args, input_ids=x)"))


def test_the_head_a_call_or_its_forward_runs():
    facts = _facts(
        """
        from transformers import AutoModelForCausalLM, BertForSequenceClassification
        lm = AutoModelForCausalLM.from_pretrained("gpt2")
        classifier = BertForSequenceClassification.from_pretrained("bert-base-uncased")
        lm(**batch)
        lm.forward(**batch)
        classifier(**batch)
        other(**batch)
        """
    )
    assert called_head(facts, _call(facts, "lm")).kind == "causal"
    assert called_head(facts, _call(facts, "lm.forward")).kind == "causal"
    assert called_head(facts, _call(facts, "classifier")).kind == "sequence"
    assert called_head(facts, _call(facts, "other")) is None


def test_calls_that_may_run_a_model():
    facts = _facts(
        """
        import torch.nn.functional as F
        def helper(**kw):
            return kw
        model(**batch)
        self.model(**batch)
        helper(**batch)
        batch.update(**extra)
        dict(**batch)
        F.cross_entropy(**kw)
        """
    )
    module = facts.index.module
    assert {module.code_for_node(c.func): may_call_model(facts, c) for c in facts.calls} == {
        "model": True,
        "self.model": True,
        "helper": False,
        "batch.update": False,
        "dict": False,
        "F.cross_entropy": False,
    }


def test_batch_holds_a_key_read_in_the_function_or_stored_by_its_collate():
    facts = _facts(
        """
        from torch.utils.data import DataLoader

        def collate(rows):
            return {"input_ids": ids, "labels": ids}

        def train():
            loader = DataLoader(data, collate_fn=collate)
            for batch in loader:
                model(**batch)

        def step(batch):
            batch["shift_labels"] = shift(batch["input_ids"])
            model(**batch)
        """
    )
    loop_call, step_call = [c for c in facts.calls if facts.index.module.code_for_node(c.func) == "model"]
    batch = loop_call.args[0].value
    assert batch_holds(facts, loop_call, batch, "labels")  # the collate function stores it
    assert not batch_holds(facts, loop_call, batch, "shift_labels")
    assert batch_holds(facts, step_call, step_call.args[0].value, "shift_labels")  # written in the function
    assert not batch_holds(facts, step_call, step_call.args[0].value, "labels")
