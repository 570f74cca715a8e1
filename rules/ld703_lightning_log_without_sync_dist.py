"""LD703 lightning-log-without-sync-dist: an epoch-level `self.log` of a per-rank value without `sync_dist=True`.

Read in Lightning's source (`src/lightning/pytorch/core/module.py`, `LightningModule.log`;
`trainer/connectors/logger_connector/result.py`, `_ResultCollection.log` and `_get_cache`;
`trainer/connectors/logger_connector/fx_validator.py`, the per-hook defaults):

- `LightningModule.log` turns numbers into tensors (`apply_to_collection(value, (Tensor, numbers.Number),
  self.__to_tensor, name)`), so a `.item()` float is kept exactly like a tensor: `_ResultMetric(meta,
  is_tensor=True)`, averaged over the rank's own batches, and reduced across ranks only when
  `sync_dist=True` (`sync_dist and trainer._accelerator_connector.is_distributed`).
- A torchmetrics `Metric` object is stored with `is_tensor=False`: the metric syncs its own states in
  `compute()`, and Lightning neither warns nor needs `sync_dist`.
- At epoch end `_get_cache` warns, once per key, when `not sync_dist and is_tensor and
  _distributed_is_initialized()`: "It is recommended to use `self.log('<name>', ..., sync_dist=True)` when
  logging on epoch level in distributed setting to accumulate the metric across devices."
  (`PossibleUserWarning`).
- Without `on_epoch=`/`on_step=`, `validation_step`, `test_step`, `on_validation_batch_*`, `on_test_batch_*`
  and every `on_*_start`/`on_*_epoch_*` hook log on epoch level; `training_step` and the train-batch hooks log
  on step level.
"""

from __future__ import annotations

import re

import libcst as cst

from lintdist.branches import conditional_within
from lintdist.edits import with_keyword_last
from lintdist.facts import argument_of
from lintdist.lightning import (
    EPOCH_LEVEL_HOOKS,
    STEP_LEVEL_HOOKS,
    in_training_branch,
    names_training_stage,
    per_rank_log_value,
    running_hooks,
    runs_on_one_device,
)
from lintdist.main_process import outermost_function
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Pattern, Rule, Valid


class LightningLogWithoutSyncDist(Rule):
    """
    ## What it does
    Reports `self.log(name, value)` and `self.log_dict(...)` in a
    `LightningModule` (any import spelling, and local subclasses) that log on
    epoch level without `sync_dist=True`: calls in `validation_step`,
    `test_step`, `on_validation_epoch_end` and the other hooks whose default
    is `on_epoch=True` (also through a helper method they call), and calls
    with `on_epoch=True` anywhere, when the value is a per-rank tensor or
    number (a loss, an accuracy computed from the batch, a `.item()`).

    Not reported: a torchmetrics `Metric` object (or `MetricCollection`)
    passed to `self.log`, a value from `.compute()` (torchmetrics syncs it), a
    value that is the same on every rank (`self.current_epoch`, the learning
    rate), a call with `sync_dist=` given (even `False`: a deliberate choice),
    with `rank_zero_only=True`, or under a rank condition
    (`if self.trainer.is_global_zero:`), and a file whose every `Trainer(...)`
    runs one device (`devices=1`, or `accelerator="cpu"` without `devices`),
    and test modules (`tests/`, `test_*.py`), which run a module on one device.

    `sync_dist=True` on a step-level log in `training_step` is reported at
    info level: it costs one all-reduce per logged value per step.

    ## Why is this bad?
    Each rank averages only the batches it saw. Without `sync_dist=True` the
    epoch value is never reduced across devices: the logger (rank 0) records
    rank 0's shard alone, and `ModelCheckpoint`/`EarlyStopping` monitoring
    that key compare a different number on every rank. Lightning combines
    their decisions (`reduce_boolean_decision`): `ModelCheckpoint` keeps a new
    best only when every rank's own value improved, and `EarlyStopping` stops
    every rank as soon as one rank's value stalls. Lightning warns
    once per key at run time (`PossibleUserWarning`: "It is recommended to use
    `self.log('val_loss', ..., sync_dist=True)` when logging on epoch level
    in distributed setting to accumulate the metric across devices."), a
    warning that is easy to miss among the start-up messages. A `.item()`
    float is no exception: `self.log` turns it into a tensor first.

    Lightning's default `Trainer(devices="auto")` uses every visible GPU, so
    a module is treated as distributed unless its file pins one device.

    ## Example
    ```python
    import lightning as L
    import torch.nn.functional as F


    class Classifier(L.LightningModule):
        def validation_step(self, batch, batch_idx):
            x, y = batch
            loss = F.cross_entropy(self(x), y)
            self.log("val_loss", loss)
    ```

    ## Use instead
    ```python
    import lightning as L
    import torch.nn.functional as F


    class Classifier(L.LightningModule):
        def validation_step(self, batch, batch_idx):
            x, y = batch
            loss = F.cross_entropy(self(x), y)
            self.log("val_loss", loss, sync_dist=True)
    ```

    ## Fix safety
    Safe: `sync_dist=True` is appended as the last keyword. It adds one
    all-reduce per key at epoch end (per step for `on_step=True`), on every
    rank, since Lightning calls these hooks on all ranks. No fix is offered
    when the call sits under an `if`/`while` inside its method: a key logged
    on some ranks only would leave the others waiting in the reduction.

    ## References
    - Lightning `src/lightning/pytorch/core/module.py`: `LightningModule.log` (numbers become tensors;
      `sync_dist and trainer._accelerator_connector.is_distributed`)
    - Lightning `src/lightning/pytorch/trainer/connectors/logger_connector/result.py`:
      `_ResultCollection._get_cache` (the `PossibleUserWarning` and its condition)
    - Lightning `src/lightning/pytorch/trainer/connectors/logger_connector/fx_validator.py` (defaults per hook)
    - [Lightning: Synchronize validation and test logging](https://lightning.ai/docs/pytorch/stable/accelerators/accelerator_prepare.html#synchronize-validation-and-test-logging)
    - [Lightning #20153 / PR #21841: the warning is a false positive for values from TorchMetrics](https://github.com/Lightning-AI/pytorch-lightning/pull/21841)
    - [lightning-bolts PR #371: sync val/test logging under DDP](https://github.com/Lightning-Universe/lightning-bolts/pull/371)
    - [NeMo PR #10257: `sync_dist=True` for validation metrics after checkpoints were lost](https://github.com/NVIDIA-NeMo/Speech/pull/10257)
    - [rf-detr #909: the warning in a multi-GPU run](https://github.com/roboflow/rf-detr/issues/909)
    """

    code = "LD703"
    name = "lightning-log-without-sync-dist"
    severity = Severity.WARNING
    fix_kind = "safe"
    # the class, or a hook posted without it (`def validation_step(self, batch, batch_idx):` at the top of a snippet)
    triggers = ("LightningModule", Pattern(("_step(self",), re.compile(r"(?m)^def \w+_step\(self")))
    also_triggers = (("self.log(", "self.log_dict("),)

    VALID = (
        Valid(
            """\
import lightning as L
import torchmetrics


class Classifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.val_acc = torchmetrics.Accuracy(task="multiclass", num_classes=10)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.val_acc(self(x), y)
        self.log("val_acc", self.val_acc)

    def on_validation_epoch_end(self):
        self.log("val_acc_epoch", self.val_acc.compute())
        self.log("epoch", float(self.current_epoch))
"""
        ),
        Valid(
            """\
import lightning as L


class Classifier(L.LightningModule):
    def training_step(self, batch, batch_idx):
        loss = self(batch).mean()
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        loss = self(batch).mean()
        self.log("val_loss", loss, sync_dist=True)
        if self.trainer.is_global_zero:
            self.log("val_loss_rank0", loss, rank_zero_only=True)


trainer = L.Trainer(accelerator="cpu")
"""
        ),
        Valid(
            """\
from pytorch_lightning import LightningModule, Trainer


class Regressor(LightningModule):
    def validation_step(self, batch, batch_idx):
        self.log("val_mse", self(batch).pow(2).mean())


Trainer(devices=1, max_epochs=3).fit(Regressor())
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
import lightning as L
import torch.nn.functional as F


class Classifier(L.LightningModule):
    def validation_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("val_loss", loss, prog_bar=True)
        self.log_dict({"val_acc": (self(x).argmax(-1) == y).float().mean().item()})
""",
            lines=(9, 10),
            fixed="""\
import lightning as L
import torch.nn.functional as F


class Classifier(L.LightningModule):
    def validation_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("val_loss", loss, prog_bar=True, sync_dist=True)
        self.log_dict({"val_acc": (self(x).argmax(-1) == y).float().mean().item()}, sync_dist=True)
""",
        ),
        Invalid(
            """\
import lightning.pytorch as pl


class Base(pl.LightningModule):
    def _shared_step(self, batch, stage):
        loss = self(batch).mean()
        self.log(
            f"{stage}_loss",
            loss,
        )
        return loss


class Model(Base):
    def training_step(self, batch, batch_idx):
        loss = self(batch).mean()
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        return loss

    def test_step(self, batch, batch_idx):
        return self._shared_step(batch, "test")
""",
            lines=(7, 17),
            fixed="""\
import lightning.pytorch as pl


class Base(pl.LightningModule):
    def _shared_step(self, batch, stage):
        loss = self(batch).mean()
        self.log(
            f"{stage}_loss",
            loss,
            sync_dist=True,
        )
        return loss


class Model(Base):
    def training_step(self, batch, batch_idx):
        loss = self(batch).mean()
        self.log("train_loss", loss, on_step=True, on_epoch=True, sync_dist=True)
        return loss

    def test_step(self, batch, batch_idx):
        return self._shared_step(batch, "test")
""",
        ),
        Invalid(
            """\
import lightning as L


class Model(L.LightningModule):
    def training_step(self, batch, batch_idx):
        loss = self(batch).mean()
        self.log("loss", loss, sync_dist=True)
        return loss


trainer = L.Trainer(devices=4, strategy="ddp")
""",
            lines=(7,),
        ),
    )

    def finish(self) -> None:
        if self.context.is_test_module:
            return  # a test builds a module to exercise it, on one device (litgpt's `tests/test_trainer_support.py`)
        facts = self.facts
        modules = [cls for cls in facts.classes if facts.is_lightning_module(cls)]
        # a snippet of hooks posted without their class (`def validation_step(self, batch, batch_idx):` at the top)
        self._fragments = (
            []
            if facts.classes
            else [
                f
                for f in facts.index.nodes(cst.FunctionDef)
                if facts.enclosing_function(f) is None and _hook_without_class(f)
            ]
        )
        if not (modules or self._fragments) or runs_on_one_device(facts):
            return
        for call in facts.calls:
            func = call.func
            if not (
                isinstance(func, cst.Attribute)
                and func.attr.value in {"log", "log_dict"}
                and isinstance(func.value, cst.Name)
                and func.value.value == "self"
            ):
                continue
            method = outermost_function(facts, call)
            if method is None or (facts.enclosing_class(method) not in modules and method not in self._fragments):
                continue
            self._check(call, method, func.attr.value)

    def _check(self, call: cst.Call, method: cst.FunctionDef, kind: str) -> None:
        facts = self.facts
        if any(arg.star for arg in call.args):
            return  # `**kwargs` may carry `sync_dist` or `on_epoch`: unknown
        sync = argument_of(call, "sync_dist", None)
        on_epoch = _literal(argument_of(call, "on_epoch", None))
        on_step = _literal(argument_of(call, "on_step", None))
        hooks = running_hooks(facts, method)
        # a helper shared by the stages logs a training value: its key says `train` (`f"train/{k}"`), or it sits
        # in the body of an `if` that tests for the training stage (`if stage == "train":`, `if self.training:`)
        training = kind == "log" and names_training_stage(argument_of(call, "name", 0))
        if hooks & STEP_LEVEL_HOOKS and (training or in_training_branch(facts, call, method)):
            hooks &= STEP_LEVEL_HOOKS  # a helper shared by the hooks, on its training branch
        if sync is not None:
            if (
                _literal(sync) is True
                and on_epoch is not True
                and on_step is not False
                and hooks
                and hooks <= STEP_LEVEL_HOOKS
            ):
                self.report(
                    call,
                    "`sync_dist=True` on a step-level log in `training_step` all-reduces this value at every step; "
                    "log it with `on_epoch=True` (reduced once per epoch) unless the per-step value must be global",
                    severity=Severity.INFO,
                )
            return
        if on_epoch is False or (on_epoch is None and argument_of(call, "on_epoch", None) is not None):
            return  # off, or decided at run time
        if on_epoch is None and not (hooks & EPOCH_LEVEL_HOOKS):
            return
        if _literal(argument_of(call, "rank_zero_only", None)) is True or facts.rank_split(call) is not None:
            return
        value = argument_of(call, "dictionary", 0) if kind == "log_dict" else argument_of(call, "value", 1)
        if value is None or not per_rank_log_value(facts, value, call, kind == "log_dict"):
            return
        name = argument_of(call, "name", 0) if kind == "log" else None
        shown = name.value if isinstance(name, cst.SimpleString) else "'<name>'"
        where = "with `on_epoch=True`" if on_epoch is True else f"in `{min(hooks & EPOCH_LEVEL_HOOKS)}`"
        message = (
            f"`self.{kind}` {where} logs on epoch level without `sync_dist=True`: each rank averages only its own "
            "batches and the value is never reduced across devices (the logger records rank 0's shard; "
            "`ModelCheckpoint` and `EarlyStopping` compare each rank's own value, a new best is kept only when every "
            'rank agrees and training stops when any rank asks); Lightning warns "It is recommended to use '
            f'`self.log({shown}, ..., sync_dist=True)` when logging on epoch level in distributed setting"'
        )
        fix = None
        if conditional_within(facts, call, method):
            message += "; the call is under a condition: add `sync_dist=True` only if every rank reaches it"
        else:
            fix = Fix(
                Applicability.SAFE,
                "Add `sync_dist=True`",
                replacements=((call, with_keyword_last(call, "sync_dist", cst.Name("True"))),),
            )
        if method in self._fragments:  # nothing in sight says that several devices run it
            message += " (the hook is shown without its class or Trainer: this holds when it runs on several devices)"
        self.report(call, message, fix=fix, severity=Severity.INFO if method in self._fragments else None)

    # -- what is logged ---------------------------------------------------------------------


def _literal(expr: cst.BaseExpression | None) -> object:
    if isinstance(expr, cst.Name) and expr.value in {"True", "False", "None"}:
        return {"True": True, "False": False, "None": None}[expr.value]
    if isinstance(expr, cst.Integer):
        return expr.evaluated_value
    if isinstance(expr, cst.SimpleString):
        return expr.evaluated_value
    return None


def _hook_without_class(function: cst.FunctionDef) -> bool:
    """A top-level ``def <epoch-level hook>(self, ...)``: a LightningModule method posted without its class."""
    params = function.params.params
    return function.name.value in EPOCH_LEVEL_HOOKS and bool(params) and params[0].name.value == "self"
