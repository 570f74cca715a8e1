"""LD101 accumulate-multiple-forward: one `accumulate` block that runs several backward passes."""

from __future__ import annotations

import re

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.bindings import arithmetic, rebinds_any, variable_names
from lintdist.edits import summed, with_arg_changes, without_statements
from lintdist.facts import BACKWARD_METHODS
from lintdist.gradients import flows_into, gradient_sources, runs_in_step
from lintdist.loop import keyword
from lintdist.model import Applicability, Fix, Severity
from lintdist.passes import EXITS, BlockWalk, PassCounter, models_per_backward
from lintdist.rule import Invalid, Rule, Valid
from lintdist.wrappers import forward_of

# Calls that read or change gradients: moving a backward past one of them changes what it sees.
GRADIENT_USERS = frozenset(
    {"step", "zero_grad", "clip_grad_norm_", "clip_grad_value_", "unscale_", "requires_grad_", *BACKWARD_METHODS}
)


class AccumulateMultipleForward(Rule):
    """
    ## What it does
    Reports a `with accelerator.accumulate(...)` block that runs more than one
    backward pass on some path through it (the branches of an `if` are
    alternatives), or a loop that runs backward inside the block. It also
    reports (as a warning, at the model's call) a block whose one backward
    flows through another model that trains in its own `accumulate` block,
    unfrozen, when nothing clears that model's gradients before its own
    window. Backward passes are `accelerator.backward(loss)`,
    `loss.backward()` and those reached through helper functions of the same
    file. The report points at the `accumulate(...)` call. It is an error
    when DeepSpeed is in evidence (a `DeepSpeedPlugin` in the code, or a
    launch config that selects it), a warning otherwise.

    ## Why is this bad?
    `accumulate` counts one micro-batch each time the block is entered, and
    `accelerator.backward` divides every loss by `gradient_accumulation_steps`.
    A loop of backward passes inside one block therefore sums k micro-batches
    per count: the gradient is k times the intended mean. Two backward passes
    on a sync step go wrong in other ways: under DeepSpeed each
    `accelerator.backward` of a sync step steps the optimizer, so it steps
    twice on partial gradients; under DDP a backward that follows an already
    synchronised backward of the same forward is not all-reduced, so the ranks
    silently drift apart. With a generator and a discriminator in one
    `accumulate(gen, disc)` block, the generator's loss, which flows through
    the discriminator, fills the discriminator's gradients too. They add to
    its next step unless something clears them in between: a `zero_grad()`
    after each step does not (the leak needs no accumulation), and while
    accumulating `zero_grad()` does nothing at all. Teacher, EMA and reference models, `generate`, calls under
    `torch.no_grad()`/`inference_mode()`, GANs that give each model its own
    block, GANs that freeze the discriminator with `requires_grad_(False)`
    for the generator's backward, and blocks of several models where each
    model runs for one backward only (ELECTRA-style generator and
    discriminator) are not reported. Several forward calls that feed one loss
    and one backward are one step and are not reported either: a
    discriminator on the real and the fake halves, the query and document
    towers of a bi-encoder, two masked views of one batch.

    A GAN that gives each model its own block still leaks when the
    generator's loss runs through the discriminator: that backward fills the
    discriminator's gradients too, and they reach the discriminator's next
    step, with or without accumulation (while accumulating its optimizer's
    `zero_grad()` does nothing).
    Freezing the discriminator for the generator's backward, detaching, a
    backward restricted with `inputs=`, or a `zero_grad()` in the training
    loop outside the `accumulate` blocks (it runs on the sync step between
    the windows) keeps this quiet.

    ## Example
    ```python
    for batch in loader:
        with accelerator.accumulate(model):
            outputs = model(**batch)
            accelerator.backward(outputs.loss, retain_graph=True)
            accelerator.backward(aux_weight * outputs.aux_loss)
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Use instead
    ```python
    for batch in loader:
        with accelerator.accumulate(model):
            outputs = model(**batch)
            accelerator.backward(outputs.loss + aux_weight * outputs.aux_loss)
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Fix safety
    Safe, for one shape only: k `accelerator.backward(x_i)` statements directly
    in the block, with nothing between them that steps or clears the
    optimizer, reads or clips gradients, calls the accumulated model, leaves
    the block, or rebinds the losses. The fix drops all but the last and makes
    it `accelerator.backward(x_1 + ... + x_k)`: gradients add up, so on one
    process the result equals the separate passes, minus the extra passes;
    under DDP every rank now all-reduces the whole gradient, and under
    DeepSpeed the optimizer steps once. A `retain_graph=` keyword on a
    dropped call is no longer needed. Loops, branches, backward passes in
    helper functions and GAN steps with an optimizer call between the passes
    are reported without a fix: one `accumulate` block per micro-batch (or
    per model) is a change of structure for a person to make.

    ## References
    - accelerate `Accelerator.accumulate` (`_do_sync` once per `with` entry) and
      `Accelerator.backward` (divides by `gradient_accumulation_steps`; under
      DeepSpeed, `DeepSpeedEngineWrapper.backward` steps the engine when
      `sync_gradients` is True)
    - accelerate docs, "Performing gradient accumulation with Accelerate"
    - `torch.nn.parallel.DistributedDataParallel` reducer: autograd hooks that
      fire after a finished reduction are ignored
    """

    code = "LD101"
    name = "accumulate-multiple-forward"
    severity = Severity.WARNING
    fix_kind = "safe"
    triggers = (re.compile(r"accumulate(?<!\waccumulate)\s*\("),)  # `with accelerator.accumulate(model):`

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

accelerator = Accelerator(gradient_accumulation_steps=4)
for batch in loader:
    with accelerator.accumulate(model):
        if batch["kind"] == "text":
            accelerator.backward(model(batch["text"]).loss)
        else:
            accelerator.backward(model(batch["image"]).loss)
        optimizer.step()
"""
        ),
        Valid(
            """\
import torch
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=2)
for batch in loader:
    with accelerator.accumulate(student):
        with torch.no_grad():
            target = teacher(batch)
            check = student(batch)
        loss = distill(student(batch), target)
        accelerator.backward(loss)
        ema.update(student)
        optimizer.step()
"""
        ),
        Valid(
            """\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=2)
for real in loader:
    with accelerator.accumulate(disc):
        d_loss = disc_loss(disc(real), disc(gen(noise()).detach()))
        accelerator.backward(d_loss)
        d_opt.step()
        d_opt.zero_grad()
    with accelerator.accumulate(gen):
        disc.requires_grad_(False)
        g_loss = gen_loss(disc(gen(noise())))
        accelerator.backward(g_loss)
        disc.requires_grad_(True)
        g_opt.step()
        g_opt.zero_grad()
"""
        ),
        Valid(
            """\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=2)
for first, second in loader:
    with accelerator.accumulate(model):
        loss = criterion(model(first)) + criterion(model(second))
        accelerator.backward(loss)
        optimizer.step()
"""
        ),
        Valid(
            """\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=2)
for real in loader:
    with accelerator.accumulate(gen, disc):
        accelerator.backward(disc_loss(disc(real), disc(gen(noise()).detach())))
        d_opt.step()
        d_opt.zero_grad()
        disc.requires_grad_(False)
        accelerator.backward(gen_loss(disc(gen(noise()))))
        disc.requires_grad_(True)
        g_opt.step()
        g_opt.zero_grad()
"""
        ),
        Valid(
            """\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=2)


def generator_step(generator, batch):
    out = generator(**batch)
    accelerator.backward(out.loss)
    return out.logits


for batch in loader:
    with accelerator.accumulate(generator, discriminator):
        logits = generator_step(generator, batch)
        replaced = sample_tokens(logits.detach(), batch)
        accelerator.backward(discriminator(**replaced).loss)
        optimizer.step()
        optimizer.zero_grad()
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4)
for batch in loader:
    with accelerator.accumulate(model):
        outputs = model(**batch)
        # the language-model loss first
        accelerator.backward(outputs.loss, retain_graph=True)
        accelerator.backward(0.1 * outputs.aux_loss)
        optimizer.step()
        optimizer.zero_grad()
""",
            lines=(5,),
            fixed="""\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4)
for batch in loader:
    with accelerator.accumulate(model):
        outputs = model(**batch)
        # the language-model loss first
        accelerator.backward(outputs.loss + 0.1 * outputs.aux_loss)
        optimizer.step()
        optimizer.zero_grad()
""",
        ),
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4)
for batch in loader:
    with accelerator.accumulate(model):
        for chunk in batch.split(8):
            loss = model(chunk).mean()
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
""",
            lines=(5,),
        ),
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=2)
for real in loader:
    with accelerator.accumulate(gen, disc):
        accelerator.backward(disc_loss(disc(real), disc(gen(noise()).detach())))
        d_opt.step()
        d_opt.zero_grad()
        accelerator.backward(gen_loss(disc(gen(noise()))))
        g_opt.step()
        g_opt.zero_grad()
""",
            lines=(5,),
        ),
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=2)
for real in loader:
    with accelerator.accumulate(disc):
        d_loss = disc_loss(disc(real), disc(gen(noise()).detach()))
        accelerator.backward(d_loss)
        d_opt.step()
        d_opt.zero_grad()
    with accelerator.accumulate(gen):
        g_loss = gen_loss(disc(gen(noise())))
        accelerator.backward(g_loss)
        g_opt.step()
        g_opt.zero_grad()
""",
            lines=(11,),
        ),
    )

    def finish(self) -> None:
        blocks = self.loop.accumulate_blocks
        for block in blocks:
            models = _model_names(block.models)
            others = frozenset(name for other in blocks if other is not block for name in _model_names(other.models))
            self._check(block.node, block.call, models, others - models)

    # -- the analysis ------------------------------------------------------------------------

    def _check(self, block: cst.With, call: cst.Call, models: frozenset[str], others: frozenset[str]) -> None:
        walker = PassCounter(self.loop, models)
        most = walker.suite(block.body).most
        walk = walker.walk
        accelerator = get_full_name_for_node(call.func.value) or "accelerator"
        subject = f"`{accelerator}.accumulate(...)`"
        severity = Severity.ERROR if self.loop.backend == "DEEPSPEED" else None
        if walk.loop is not None:
            message = (
                f"a loop runs backward inside one {subject} block, but accelerate counts each block as one "
                "micro-batch: the gradient sums every iteration while being divided by the accumulation steps "
                "only, and DeepSpeed steps at each backward of a sync step; open one `accumulate` block per "
                "micro-batch, inside the loop"
            )
            self.report(call, message, severity=severity)
        elif most.backward > 1:
            span = self.context.span
            if walk.frozen and span(walk.frozen[0]).line < span(walk.backward_calls[-1]).line:
                return  # a GAN that freezes the discriminator for the generator's backward
            if len(models) > 1 and self._models_kept_apart(block, models, walker):
                return  # each model feeds one backward only (ELECTRA-style): nothing leaks between them
            if len(models) > 1:
                message = (
                    f"{most.backward} backward passes run in one {subject} block of several models: a loss that "
                    "flows through both models fills the other's gradients too, which add to its next step unless "
                    "cleared in between (and while accumulating `zero_grad()` does nothing); give each model its "
                    "own `accumulate` block, or freeze the other model (`requires_grad_(False)`) for the second "
                    "backward"
                )
            else:
                message = (
                    f"{most.backward} backward passes run in one {subject} block, which accelerate counts as one "
                    "micro-batch: DeepSpeed steps the optimizer at each backward of a sync step, and DDP can leave a "
                    f"later backward un-synchronised across ranks; call `{accelerator}.backward` once, on the summed "
                    "loss"
                )
            fix = _sum_fix(self, block, walk.backward_calls, most.backward, models)
            self.report(call, message, fix=fix, severity=severity)
        elif most.backward == 1 and others:
            leak = self._leak(block, others, walk)
            if leak is not None:
                other, name = leak
                message = (
                    f"the backward in this {subject} block also fills `{name}`'s gradients (its loss flows through "
                    f"`{name}`, which trains in its own `accumulate` block): they add to `{name}`'s next backward "
                    "unless cleared in between, which a `zero_grad()` after each step does not do, and while "
                    f"accumulating `zero_grad()` does nothing at all; freeze it for this backward "
                    f"(`{name}.requires_grad_(False)`, then `True` again after the backward)"
                )
                self.report(other, message, severity=Severity.WARNING)

    def _leak(self, block: cst.With, others: frozenset[str], walk: BlockWalk) -> tuple[cst.Call, str] | None:
        """A model trained in another ``accumulate`` block feeds this block's loss, unfrozen and not detached, and
        nothing clears its gradients: not in this block, and not between the windows (a ``zero_grad`` in the
        training loop outside the ``accumulate`` blocks)."""
        facts = self.facts
        backwards = [c for c in walk.backward_calls if facts.is_within(c, block)]
        if len(backwards) != 1 or walk.frozen or keyword(backwards[0], "inputs") is not None:
            return None
        calls = [c for c in facts.calls_within(block.body) if runs_in_step(facts, c, block)]
        cleared = {
            get_full_name_for_node(c.func.value)
            for c in calls
            if facts.method_name(c) in {"zero_grad", "requires_grad_"} and isinstance(c.func, cst.Attribute)
        }
        around = facts.enclosing_loop(block)
        if around is not None and any(
            facts.method_name(c) == "zero_grad" and self.loop.accumulate_block_of(c) is None
            for c in facts.calls_within(around)
        ):
            return None  # gradients are cleared between the windows, outside the accumulate blocks
        loss = self.loop.backward_site(backwards[0]).loss
        sources = gradient_sources(facts, loss, block.body, backwards[0]) if loss is not None else []
        for call in calls:
            name = forward_of(call, others)
            if name is not None and name not in cleared and any(flows_into(facts, call, s) for s in sources):
                return call, name
        return None

    def _models_kept_apart(self, block: cst.With, models: frozenset[str], walker: PassCounter) -> bool:
        """Every backward pass sees at least one accumulated model and no model runs for two of them (a model that
        does collects both gradients while ``zero_grad()`` does nothing: that is the leak)."""
        runs = models_per_backward(walker, block, self.context.span)
        if len(runs) < 2 or not all(runs):
            return False
        return all(sum(name in used for used in runs) <= 1 for name in models)


# -- small pure helpers --------------------------------------------------------------------------


def _model_names(models: tuple[cst.BaseExpression, ...]) -> frozenset[str]:
    return frozenset(name for model in models if (name := get_full_name_for_node(model)) is not None)


# -- the fix ---------------------------------------------------------------------------------------


def _sum_fix(rule: Rule, block: cst.With, calls: list[cst.Call], count: int, models: frozenset[str]) -> Fix | None:
    """Drop all but the last ``accelerator.backward(x_i)`` statement and backpropagate the sum there."""
    body = block.body
    if not isinstance(body, cst.IndentedBlock) or len(calls) != count:
        return None
    statements = list(body.body)
    positions = [_backward_statement(rule, statements, call) for call in calls]
    if None in positions or positions != sorted(set(positions)):
        return None
    operands = [call.args[0].value for call in calls]
    if not all(arithmetic(arg) for arg in operands[:-1]):
        return None
    used = {name for arg in operands[:-1] for name in variable_names(rule.facts, arg)}
    for index in range(positions[0] + 1, positions[-1] + 1):
        if index not in positions and not _may_move_past(rule, statements[index], models):
            return None
        if rebinds_any(rule.facts, statements[index], used):
            return None
    loss = calls[-1].args[0]
    new_last = with_arg_changes(calls[-1], {id(loss): loss.with_changes(value=summed(operands))})
    statements[positions[-1]] = statements[positions[-1]].deep_replace(calls[-1], new_last)
    sums = " + ".join(cst.Module([]).code_for_node(op) for op in operands)
    return Fix(
        Applicability.SAFE,
        f"Backpropagate the summed loss once: `backward({sums})`",
        replacements=((body, body.with_changes(body=without_statements(statements, set(positions[:-1])))),),
    )


def _backward_statement(rule: Rule, statements: list[cst.BaseStatement], call: cst.Call) -> int | None:
    """The index of the statement that is exactly ``<accelerator>.backward(x)`` (``retain_graph=`` at most) for
    this call, else None."""
    expression = rule.facts.parent(call)
    line = rule.facts.parent(expression)
    site = rule.loop.backward_site(call)
    if site is None or site.kind != "accelerator" or call.args[0].value is not site.loss:
        return None  # not `<accelerator>.backward(loss, ...)`
    keywords = {a.keyword.value if a.keyword else None for a in call.args[1:]}
    if not isinstance(expression, cst.Expr) or len(line.body) != 1 or keywords - {"retain_graph"}:
        return None
    return next((i for i, statement in enumerate(statements) if statement is line), None)


def _may_move_past(rule: Rule, statement: cst.BaseStatement, models: frozenset[str]) -> bool:
    """Nothing here uses gradients, leaves the block or runs the accumulated model."""
    facts = rule.facts
    for call in facts.reachable_calls(statement):
        if facts.method_name(call) in GRADIENT_USERS or forward_of(call, models) is not None:
            return False
    return not facts.within(statement, *EXITS) and not any(
        node.attr.value == "grad" for node in facts.within(statement, cst.Attribute)
    )
