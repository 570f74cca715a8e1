"""LD108 double-loss-scaling: a loss divided by the accumulation steps before `accelerator.backward`, which divides again."""

from __future__ import annotations

import re

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.deepspeed_settings import reads_accumulation_steps
from lintdist.edits import remove_division
from lintdist.loop import Accumulation, Division
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Rule, Valid


class DoubleLossScaling(Rule):
    """
    ## What it does
    Reports a loss divided by the gradient accumulation steps (`loss = loss /
    k` or `loss /= k`, also inline) that then goes through
    `accelerator.backward(loss)` while that Accelerator accumulates gradients:
    `Accelerator(gradient_accumulation_steps=k)`, a
    `GradientAccumulationPlugin(num_steps=k)`, a launch that sets
    `gradient_accumulation_steps`, or `accumulate` blocks with no setting in
    sight. The divisor must be the accumulation steps:
    `accelerator.gradient_accumulation_steps`, a name that says accumulation
    (`args.gradient_accumulation_steps`, `accum_iter`), or the literal the
    Accelerator is built with. The report points at the division. It is a
    warning, without a fix, when no setting of the steps is in sight, and
    when the Accelerator has one step but the divisor is read from the
    DeepSpeed config (`deepspeed_plugin.deepspeed_config[
    "gradient_accumulation_steps"]`): under DeepSpeed the engine divides by
    those steps itself (accelerate 1.15 `Accelerator.backward` leaves the
    division to it), so the hand division is a second one there and the
    only one elsewhere.

    ## Why is this bad?
    `accelerator.backward` already divides every loss by
    `gradient_accumulation_steps` (under DeepSpeed the engine does, with the
    same value): a second division makes each optimizer step's gradient k
    times too small. Nothing fails; training is only slower, like a learning
    rate k times lower, and the clipping threshold and the warm-up no longer
    mean what they say. Not reported: a division by something else (a token
    count, the world size, a literal that is not the configured steps), the
    token-level recipe that multiplies by the steps on purpose (`loss *
    accelerator.gradient_accumulation_steps * accelerator.num_processes /
    num_tokens`), a loss scaled by `lintdist.runtime`'s `TokenLossWindow`, and
    an Accelerator that is built with one step and no `accumulate` block (the
    manual accumulation of accelerate's own `nlp_example.py` divides once,
    correctly).

    ## Example
    ```python
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
    for batch in train_dataloader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            loss = loss / args.gradient_accumulation_steps
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Use instead
    ```python
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
    for batch in train_dataloader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Fix safety
    Safe: the fix deletes the division (the whole statement for `loss = loss
    / k` and `loss /= k`, the `/ k` alone elsewhere), which restores the mean
    over the accumulation window that accelerate computes. It is offered when
    the Accelerator's steps are set in the code or the launch, or when the
    divisor is `accelerator.gradient_accumulation_steps` itself; not when the
    steps are unknown (no setting in sight: if the launch does not set them,
    the `accumulate` blocks do nothing and the division is the only scaling),
    nor when the divided loss is also read elsewhere (logged or summed: its
    value would change), nor when the division sits in another function.

    ## References
    - accelerate `Accelerator.backward`: `loss = loss / self.gradient_accumulation_steps`
      unless DeepSpeed, whose `engine.backward` scales by the same steps
    - accelerate guide "Performing gradient accumulation with Accelerate"
    """

    code = "LD108"
    name = "double-loss-scaling"
    severity = Severity.ERROR
    fix_kind = "safe"
    triggers = (re.compile(r"backward\s*\("),)
    also_triggers = (("accelerat",), ("/",))

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
from accelerate import Accelerator

accelerator = Accelerator()
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for step, batch in enumerate(loader):
    loss = model(**batch).loss
    loss = loss / gradient_accumulation_steps
    accelerator.backward(loss)
    if step % gradient_accumulation_steps == 0:
        optimizer.step()
        optimizer.zero_grad()
"""
        ),
        Valid(
            """\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4)
for batch in loader:
    with accelerator.accumulate(model):
        num_items = accelerator.gather(batch["labels"].ne(-100).sum()).sum()
        loss = model(**batch).loss * batch["labels"].ne(-100).sum()
        loss = loss * accelerator.gradient_accumulation_steps * accelerator.num_processes / num_items
        accelerator.backward(loss)
        optimizer.step()
"""
        ),
        Valid(
            """\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4)
for batch in loader:
    with accelerator.accumulate(model):
        loss = model(**batch).loss / 2
        accelerator.backward(loss)
        optimizer.step()
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
for batch in loader:
    with accelerator.accumulate(model):
        loss = model(**batch).loss
        # average over the window
        loss = loss / args.gradient_accumulation_steps
        accelerator.backward(loss)
        optimizer.step()
""",
            lines=(8,),
            fixed="""\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
for batch in loader:
    with accelerator.accumulate(model):
        loss = model(**batch).loss
        # average over the window
        accelerator.backward(loss)
        optimizer.step()
""",
        ),
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4)
for batch in loader:
    with accelerator.accumulate(model):
        loss = model(**batch).loss
        loss /= 4
        accelerator.backward(loss)
""",
            lines=(7,),
            fixed="""\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4)
for batch in loader:
    with accelerator.accumulate(model):
        loss = model(**batch).loss
        accelerator.backward(loss)
""",
        ),
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
for batch in loader:
    with accelerator.accumulate(model):
        outputs = model(**batch)
        accelerator.backward(outputs.loss / accelerator.gradient_accumulation_steps)
""",
            lines=(7,),
            fixed="""\
from accelerate import Accelerator

accelerator = Accelerator()
for batch in loader:
    with accelerator.accumulate(model):
        outputs = model(**batch)
        accelerator.backward(outputs.loss)
""",
        ),
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
for batch in loader:
    with accelerator.accumulate(model):
        loss = model(**batch).loss / args.grad_accum_steps
        accelerator.backward(loss)
""",
            lines=(6,),
        ),
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=8)
for batch in loader:
    with accelerator.accumulate(model):
        loss = model(**batch).loss / 8
        accelerator.backward(loss)
        total_loss += loss.detach()
""",
            lines=(6,),
        ),
    )

    def finish(self) -> None:
        seen: set[int] = set()
        for site in self.loop.backward_sites:
            if site.kind != "accelerator" or site.loss is None:
                continue
            statement = self.loop.statement_of(site.call)
            if statement is None:
                continue
            acc = self.loop.accumulation(site.receiver, site.call)
            # one step: only a divisor read from the DeepSpeed config, whose engine divides by those steps itself
            searched = Accumulation("unknown") if acc.state == "none" else acc
            division = self.loop.accumulation_division(site.loss, statement, searched)
            if division is None or id(division.term.expr) in seen:
                continue
            if acc.state == "none" and not any(
                reads_accumulation_steps(o.node) for o in self.facts.origins(division.term.expr, statement)
            ):
                continue
            seen.add(id(division.term.expr))
            self._report(site.call, site.receiver, division, acc)

    def _report(self, call: cst.Call, receiver: cst.BaseExpression, division: Division, acc: Accumulation) -> None:
        divisor = cst.Module([]).code_for_node(division.term.expr)
        accelerator = get_full_name_for_node(receiver) or "accelerator"
        where = self.facts.parent(division.term.expr)
        node = where if isinstance(where, (cst.BinaryOperation, cst.AugAssign)) else division.term.expr
        if acc.state == "none":
            message = (
                f"the loss is divided by `{divisor}`, the accumulation steps of the DeepSpeed config, and under "
                "DeepSpeed the engine's backward (`accelerator.backward`) divides by the same steps again, so every "
                "optimizer step's gradient is that many times too small; delete the division for DeepSpeed runs"
            )
            self.report(node, message, severity=Severity.WARNING)
        elif acc.state == "configured" or division.exact:
            replacements, why_not = remove_division(self.facts, division, call)
            fix = None
            if replacements is not None:
                fix = Fix(Applicability.SAFE, f"Delete the division by `{divisor}`", replacements=replacements)
            message = (
                f"the loss is divided by `{divisor}` and `{accelerator}.backward` divides it by the "
                "accumulation steps again, so every optimizer step's gradient is that many times too small; "
                f"delete the division: `{accelerator}.backward` already averages over the accumulation window"
            )
            if fix is None:
                message += f" (not fixed automatically: {why_not})"
            self.report(node, message, fix=fix)
        else:
            message = (
                f"the loss is divided by `{divisor}`, and `{accelerator}.backward` divides by the Accelerator's "
                "accumulation steps as well, which nothing in sight sets (the `accumulate` blocks say they are "
                "meant to be more than 1, and `accelerate launch` may set them): if they are, the gradient is that "
                "many times too small; set the steps on the Accelerator "
                f"(`Accelerator(gradient_accumulation_steps={divisor})`) and delete the division"
            )
            self.report(node, message, severity=Severity.WARNING)
