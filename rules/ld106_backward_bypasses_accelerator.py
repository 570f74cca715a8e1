"""LD106 backward-bypasses-accelerator: `loss.backward()` on a prepared model's loss, or in manual Lightning optimization."""

from __future__ import annotations

import re

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.edits import receiver_as_argument, remove_division, unparenthesized
from lintdist.lightning import optimizes_manually, scales_loss
from lintdist.loop import Accumulation, BackwardSite, in_method
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Rule, Valid

GRAD_SCALERS = frozenset(
    {"torch.amp.GradScaler", "torch.cuda.amp.GradScaler", "torch.amp.grad_scaler.GradScaler", "torch.GradScaler"}
)


class BackwardBypassesAccelerator(Rule):
    """
    ## What it does
    Reports `loss.backward()` in an accelerate script when the loss is computed
    from a model that went through `accelerator.prepare` (called directly, through
    its outputs' `.loss`, a criterion, or a helper function of the same file),
    any `X.backward()` inside a `with accelerator.accumulate(...):` block,
    whatever computed `X` (a wrapper class, a helper of another module: the
    block itself says the run relies on `accelerator.backward`), and
    `scaler.scale(loss).backward()` with the script's own `GradScaler` there. In a
    `LightningModule` with `automatic_optimization = False`, it reports
    `loss.backward()` in place of `self.manual_backward(loss)`. The report points
    at the `backward` call. It is an error when the script uses DeepSpeed, fp16
    mixed precision or gradient accumulation (in the code or in its launch
    config), a warning otherwise (where `loss.backward()` happens to give the
    same gradient today).

    ## Why is this bad?
    `accelerator.backward(loss)` is where accelerate does its part of the step:
    it divides the loss by `gradient_accumulation_steps`, scales it with the
    fp16 `GradScaler` whose `step` the prepared optimizer runs, and under
    DeepSpeed calls the engine's `backward` and `step` (the prepared optimizer's
    `step` does nothing there). With `loss.backward()`: under gradient
    accumulation each optimizer step's gradient is the sum of the window instead
    of its mean (k times too large); under fp16 the unscaled loss underflows
    while the scaler still unscales the gradients (they come out 65536 times too
    small); under DeepSpeed the model never trains. A script's own `GradScaler`
    beside the Accelerator skips the accumulation division and, with accelerate's
    own fp16, unscales twice. Lightning's `manual_backward` applies the
    precision plugin's scaling and the strategy's backward (DeepSpeed) in the
    same way. Not reported: models that were not prepared (a raw DDP model
    beside an Accelerator used for its device, a frozen helper network),
    `accelerator.backward`, and helpers called with prepared and unprepared
    models alike.

    ## Example
    ```python
    accelerator = Accelerator(gradient_accumulation_steps=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Use instead
    ```python
    accelerator = Accelerator(gradient_accumulation_steps=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Fix safety
    Safe: `loss.backward(**kw)` becomes `accelerator.backward(loss, **kw)`
    (`self.manual_backward(loss, **kw)` in Lightning), which is what accelerate
    and Lightning document; the gradient then has the scale the rest of the
    step (scheduler, clipping, the optimizer wrapper) expects. The fix is
    offered only where a name for the Accelerator is in scope at the call (the
    one that prepared the model, `accelerator` or `self.accelerator`, as a
    parameter, a module global, a local or an attribute of the same class).
    When the loss was already divided by the accumulation steps (the
    `loss = loss / k` that LD108 reports once the call is
    `accelerator.backward`), the same fix deletes that division, since
    `accelerator.backward` divides by the Accelerator's steps: the two changes
    are made together or not at all, so the gradient is never divided twice
    (nor left undivided). Where the division cannot be deleted cleanly, or the
    steps are unknown, there is no fix. `scaler.scale(loss).backward()` is
    reported without a fix: the script's `GradScaler` and its
    `scaler.step`/`scaler.update` calls have to go, and fp16 be set on the
    Accelerator.

    ## References
    - accelerate `Accelerator.backward` (divides by `gradient_accumulation_steps`,
      `scaler.scale(loss).backward()` for fp16, DeepSpeed's engine backward and step)
    - accelerate `AcceleratedOptimizer.step` and `DeepSpeedOptimizerWrapper.step`
    - Lightning `LightningModule.manual_backward`, "Manual optimization" guide
    """

    code = "LD106"
    name = "backward-bypasses-accelerator"
    severity = Severity.ERROR
    fix_kind = "safe"
    triggers = (re.compile(r"backward\s*\("),)
    also_triggers = (("accelerat", "lightning", "Lightning"),)

    VALID = (
        Valid(
            """\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    with accelerator.accumulate(model):
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
"""
        ),
        Valid(
            """\
import torch
from accelerate import Accelerator
from torch.nn.parallel import DistributedDataParallel as DDP

accelerator = Accelerator()
model = DDP(model.to(accelerator.device), device_ids=[accelerator.local_process_index])
loader = accelerator.prepare(loader)
for batch in loader:
    loss = model(**batch).loss
    loss.backward()
    optimizer.step()
"""
        ),
        Valid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
student, optimizer = accelerator.prepare(student, optimizer)
probe = Probe().to(accelerator.device)
for batch in loader:
    features = student(batch).detach()
    probe_loss = probe_criterion(probe(features), batch["labels"])
    probe_loss.backward()
"""
        ),
        Valid(
            """\
import lightning as L


class Module(L.LightningModule):
    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        loss = self.model(batch).loss
        self.manual_backward(loss)
        opt.step()
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
from accelerate import Accelerator
from towers import DualTower

accelerator = Accelerator(gradient_accumulation_steps=4)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
towers = DualTower(model)
for batch in loader:
    with accelerator.accumulate(model):
        towers.loss(batch).backward()
        optimizer.step()
""",
            lines=(9,),
            fixed="""\
from accelerate import Accelerator
from towers import DualTower

accelerator = Accelerator(gradient_accumulation_steps=4)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
towers = DualTower(model)
for batch in loader:
    with accelerator.accumulate(model):
        accelerator.backward(towers.loss(batch))
        optimizer.step()
""",
        ),
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    with accelerator.accumulate(model):
        outputs = model(**batch)
        outputs.loss.backward()  # the summed window
        optimizer.step()
        optimizer.zero_grad()
""",
            lines=(8,),
            fixed="""\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    with accelerator.accumulate(model):
        outputs = model(**batch)
        accelerator.backward(outputs.loss)  # the summed window
        optimizer.step()
        optimizer.zero_grad()
""",
        ),
        Invalid(
            """\
from accelerate import Accelerator
import torch.nn.functional as F


def train_step(model, batch, optimizer, accelerator):
    logits = model(batch["x"])
    loss = F.cross_entropy(logits, batch["y"])
    loss.backward(retain_graph=True)
    optimizer.step()


def main():
    accelerator = Accelerator()
    model, optimizer = accelerator.prepare(Net(), opt)
    for batch in loader:
        train_step(model, batch, optimizer, accelerator)
""",
            lines=(8,),
            fixed="""\
from accelerate import Accelerator
import torch.nn.functional as F


def train_step(model, batch, optimizer, accelerator):
    logits = model(batch["x"])
    loss = F.cross_entropy(logits, batch["y"])
    accelerator.backward(loss, retain_graph=True)
    optimizer.step()


def main():
    accelerator = Accelerator()
    model, optimizer = accelerator.prepare(Net(), opt)
    for batch in loader:
        train_step(model, batch, optimizer, accelerator)
""",
        ),
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=args.accum)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    with accelerator.accumulate(model):
        loss = model(**batch).loss
        loss = loss / args.accum
        loss.backward()
        optimizer.step()
""",
            lines=(9,),
            fixed="""\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=args.accum)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    with accelerator.accumulate(model):
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
""",
        ),
        Invalid(
            """\
import torch
from accelerate import Accelerator

accelerator = Accelerator()
scaler = torch.amp.GradScaler("cuda")
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    loss = model(**batch).loss
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
""",
            lines=(9,),
        ),
        Invalid(
            """\
import pytorch_lightning as pl


class Module(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        loss = self.compute_loss(batch)
        loss.backward()
        opt.step()
""",
            lines=(13,),
            fixed="""\
import pytorch_lightning as pl


class Module(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        loss = self.compute_loss(batch)
        self.manual_backward(loss)
        opt.step()
""",
        ),
    )

    def finish(self) -> None:
        for site in self.loop.backward_sites:
            if site.kind not in {"tensor", "scaler"} or site.loss is None:
                continue
            if self._lightning(site):
                continue
            statement = self.loop.statement_of(site.call)
            if statement is None or (site.kind == "scaler" and not self._own_scaler(site)):
                continue
            prepare = self.loop.loss_model(site.loss, statement)
            if prepare is not None:
                self._report(site, statement, prepare)
                continue
            # whatever computed the loss (a wrapper around the prepared model, a helper of another module),
            # `accumulate` says the run relies on `accelerator.backward`'s division and scaling
            block = self.loop.accumulate_block_of(site.call)
            if block is not None and site.kind == "tensor":
                self._report(site, statement, block.call, inside=True)

    # -- accelerate ---------------------------------------------------------------------------

    def _own_scaler(self, site: BackwardSite) -> bool:
        return site.receiver is not None and any(
            isinstance(o.node, cst.Call) and self.facts.callee_is(o.node, GRAD_SCALERS)
            for o in self.facts.origins(site.receiver, site.call)
        )

    def _report(self, site: BackwardSite, statement: cst.CSTNode, prepare: cst.Call, inside: bool = False) -> None:
        """``prepare``: the prepare call of the loss's model, or (``inside``) the ``accumulate`` call of the block
        the backward sits in."""
        loop = self.loop
        receiver = prepare.func.value
        acc = loop.accumulation(receiver, site.call)
        division = loop.accumulation_division(site.loss, statement, acc) if acc.state != "none" else None
        reasons = []
        if loop.backend == "DEEPSPEED":
            reasons.append("under DeepSpeed the engine never runs its backward and step, so the model does not train")
        if loop.fp16:
            reasons.append("under fp16 the loss is not scaled while the prepared optimizer still unscales")
        if acc.state == "configured" and division is None:
            reasons.append(
                "with gradient accumulation the loss is not divided by the steps, so the gradient is the window's "
                "sum, not its mean"
            )
        certain = bool(reasons)
        if acc.state == "unknown" and division is None:
            reasons.append(
                "if the launch sets gradient accumulation, the loss is not divided by the steps and the gradient is "
                "the window's sum, not its mean"
            )
        accelerator = loop.accelerator_at(prepare, site.call)
        shown = accelerator or get_full_name_for_node(receiver) or "accelerator"
        loss_text = cst.Module([]).code_for_node(unparenthesized(site.loss))
        if site.kind == "scaler":
            message = (
                f"`scaler.scale({loss_text}).backward()` with a `GradScaler` of the script's own bypasses "
                f"`{shown}.backward`: it skips accelerate's accumulation division and, with accelerate's fp16, "
                f'unscales twice; set `mixed_precision="fp16"` on the Accelerator, call '
                f"`{shown}.backward({loss_text})` and drop the scaler's `step`/`update`"
            )
            self.report(site.call, message, severity=None if certain or acc.state == "configured" else Severity.WARNING)
            return
        fix, why_not = self._fix(site, accelerator, acc, division)
        if not reasons:
            reasons.append(
                "the division by the accumulation steps stands in for accelerate's today, but fp16 scaling and "
                "DeepSpeed's backward would be skipped"
                if division is not None
                else "it gives the same gradient only while the script runs without fp16, DeepSpeed and accumulation"
            )
        known = ""
        note = self.facts.stand_in_note(prepare)
        if note:  # a snippet: the model and the accelerator are known by what is done with them
            basis = self.facts.identified(receiver, site.call, "accelerator")
            known = f" ({note}" + (f"; {basis}" if basis else "") + ")"
        where = f"inside `{shown}.accumulate(...)`" if inside else "for a model prepared by accelerate"
        message = (
            f"`{loss_text}.backward()` bypasses `{shown}.backward` {where}{known}: "
            f"{'; '.join(reasons)}; call `{shown}.backward({loss_text})`"
        )
        if division is not None:
            message += f" and delete the division by `{cst.Module([]).code_for_node(division.term.expr)}`"
        if why_not:
            message += f" ({why_not})"
        self.report(site.call, message, fix=fix, severity=None if certain else Severity.WARNING)

    def _fix(self, site: BackwardSite, accelerator: str | None, acc: Accumulation, division) -> tuple[Fix | None, str]:
        if accelerator is None:
            return None, "not fixed automatically: no name for the Accelerator is in scope here"
        new_call = receiver_as_argument(site.call, site.loss, f"{accelerator}.backward")
        if new_call is None:
            return None, ""
        if division is None:
            return Fix(
                Applicability.SAFE, f"Call `{accelerator}.backward(...)`", replacements=((site.call, new_call),)
            ), ""
        if acc.state != "configured" and not division.exact:
            return None, (
                "not fixed automatically: the loss is divided by the accumulation steps and the Accelerator's steps "
                "are unknown here"
            )
        replacements, why_not = remove_division(self.facts, division, site.call, new_call)
        if replacements is None:
            return None, f"not fixed automatically, since the division must go with it: {why_not}"
        return Fix(
            Applicability.SAFE,
            f"Call `{accelerator}.backward(...)` and delete the division by the accumulation steps",
            replacements=replacements,
        ), ""

    # -- Lightning ------------------------------------------------------------------------------

    def _lightning(self, site: BackwardSite) -> bool:
        """A ``loss.backward()`` in a LightningModule method (reported when it optimizes manually)."""
        facts = self.facts
        cls = facts.lightning_module_of(site.call)
        if cls is None:
            return False
        if site.kind == "tensor" and optimizes_manually(self.facts, cls) and in_method(self.facts, site.call):
            loss_text = cst.Module([]).code_for_node(unparenthesized(site.loss))
            message = (
                f"`{loss_text}.backward()` in a LightningModule that optimizes manually bypasses the precision "
                "plugin's scaling and the strategy's backward (DeepSpeed); call "
                f"`self.manual_backward({loss_text})`"
            )
            new_call = receiver_as_argument(site.call, site.loss, "self.manual_backward")
            fix = None
            if new_call is not None:
                fix = Fix(Applicability.SAFE, "Call `self.manual_backward(...)`", replacements=((site.call, new_call),))
            self.report(site.call, message, fix=fix, severity=None if scales_loss(self.facts) else Severity.WARNING)
        return True
