"""LD103 ddp-accumulation-without-no-sync: raw DDP gradient accumulation that all-reduces every micro-batch."""

from __future__ import annotations

import re

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.bindings import read_names, rebound_between, repeatable
from lintdist.blocks import with_block
from lintdist.control import loop_iterable, runs_whenever
from lintdist.facts import ACCELERATOR_CLASSES
from lintdist.loop import BackwardSite
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Pattern, Rule, Valid
from lintdist.windows import (
    Window,
    backward_window,
    gated_steps,
    last_iteration,
    loop_window,
    reads_unsynced_gradients,
    steps_outside,
    sync_managed,
    unstepped_tail,
)
from lintdist.wrappers import forward_run, module_wrapper_kinds, wrapped_parameters_run, wraps_elsewhere

# Frameworks that own the gradient synchronisation: a script that imports one is not a raw DDP loop. (accelerate
# counts only when the script builds an Accelerator: raw DDP scripts borrow `accelerate.utils.set_seed`.)
FRAMEWORKS = ("lightning", "pytorch_lightning", "lightning_fabric")
RAW_BACKWARDS = frozenset({"tensor", "scaler", "autograd"})
# How many levels of helper functions lintdist follows between the loop and the backward (or the step).
MAX_HELPER_DEPTH = 2


class DdpAccumulationWithoutNoSync(Rule):
    """
    ## What it does
    Reports a backward pass of a model wrapped in
    `torch.nn.parallel.DistributedDataParallel` that runs on every micro-batch
    of a gradient-accumulation loop (the optimizer steps only under an
    accumulation gate such as `if (step + 1) % accum_steps == 0:` or a counter
    compared with the accumulation steps, or only after an inner
    `for micro_step in range(accum_steps):` loop) when neither the forward nor
    the backward runs under `model.no_sync()` (or `lintdist.runtime.grad_sync`).
    The model may be wrapped in the file or by a helper of another project
    module (`model, optimizer = wrap_for_run(...)` whose function builds the
    `DistributedDataParallel`); a script that also runs under DeepSpeed is
    reported on its plain `backward` path only (the engine's
    `model.backward` manages its own accumulation).
    The report points at the backward call, or, when a helper runs the
    backward, at the helper's call in the accumulation loop (once, however
    many backwards the helper holds). When the gate is a plain modulo of
    the batch index, so that the last micro-batches of an epoch are never
    stepped, the message says so as well.

    Also reported: `model.require_backward_grad_sync = <gate>` set after the
    model's forward and before its backward in one block (a hand-made
    `no_sync`, one line too late).

    ## Why is this bad?
    DDP all-reduces the gradients in every backward pass it sees. While
    accumulating, only the last micro-batch before the optimizer step needs
    that: the all-reduce is linear, so reducing the summed local gradients once
    gives the same result as reducing each micro-batch's. Without `no_sync()`
    a loop accumulating `k` micro-batches communicates `k` times as much as it
    needs to (the accelerate docs measure about 1.2x the time of a step on one
    node and 2.2x across nodes). Only raw DDP scripts are reported:
    accelerate's `accumulate`, Lightning and Fabric skip the all-reduce
    themselves, FSDP keeps unsharded gradients under `no_sync` (LD104's
    concern), and a script that sets `model.require_backward_grad_sync` (as
    nanoGPT does), uses `no_sync` or `grad_sync` near the loop, or accumulates
    exactly 1 step (a literal) is left alone.

    ## Example
    ```python
    model = DistributedDataParallel(net)
    for step, (x, y) in enumerate(loader):
        loss = criterion(model(x), y) / accum_steps
        loss.backward()
        if (step + 1) % accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Use instead
    ```python
    from lintdist.runtime import grad_sync

    model = DistributedDataParallel(net)
    for step, (x, y) in enumerate(loader):
        with grad_sync(model, sync=(step + 1) % accum_steps == 0):
            loss = criterion(model(x), y) / accum_steps
            loss.backward()
        if (step + 1) % accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Fix safety
    Safe. The fix wraps the statements from the model's forward to the
    backward in `with grad_sync(model, sync=<gate>):`, the gate expression
    copied from the optimizer step's `if` (for an inner accumulation loop,
    `micro_step == accum_steps - 1`), and imports `grad_sync` from
    `lintdist.runtime`: it enters `model.no_sync()` unless `sync` is true. DDP
    decides in the forward whether the backward all-reduces, which is why the
    forward is inside. The gradients at each optimizer step are the same (the
    mean over ranks of the summed micro-batch gradients); between steps each
    rank holds its own partial sum. DDP also broadcasts module buffers from
    rank 0 only in forwards that sync, which changes nothing in train-mode
    gradients. The fix is offered only when that equivalence holds in sight:
    the forward and the backward are statements of one block (the backward not
    under an `if`), the gate comes after them, no name of the gate is rebound
    between the forward and the gate, the gate calls nothing but `len`, `min`,
    `max`, `int`, `bool` or `abs` (an inner accumulation loop has no `break`,
    `continue` or `return` and rebinds neither its index nor its bound), and
    every optimizer step of the loop is
    under that gate, with no gradient clipping or `.grad` read outside it (a
    step after the loop for a last partial window would then see gradients the
    fix left unsynced).

    The late `require_backward_grad_sync` assignment has a safe fix: it moves
    to just before the statement that runs the forward. torch 2.13's DDP reads
    the flag in `_pre_forward` and `_post_forward` (where `prepare_for_backward`
    arms the reducer), so set there it acts on the micro-batch it names.

    ## References
    - `torch.nn.parallel.DistributedDataParallel.no_sync` docstring
    - PyTorch DDP notes: "Gradient accumulation" and `no_sync`
    - accelerate guide "Gradient synchronization" (`no_sync` timing table)
    """

    code = "LD103"
    name = "ddp-accumulation-without-no-sync"
    severity = Severity.WARNING
    fix_kind = "safe"
    # the wrapper, or a helper module's modulo accumulation gate (the model may be wrapped by its caller)
    triggers = ("DistributedDataParallel", Pattern(("accum",), re.compile(r"%\s*\(?\s*[\w.]*accum")))
    also_triggers = (("backward",),)

    VALID = (
        # no_sync around the non-final micro-batches
        Valid(
            """\
import contextlib
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(net)
for step, (x, y) in enumerate(loader):
    last = (step + 1) % accum_steps == 0
    context = contextlib.nullcontext() if last else model.no_sync()
    with context:
        loss = criterion(model(x), y)
        loss.backward()
    if last:
        optimizer.step()
        optimizer.zero_grad()
"""
        ),
        # nanoGPT's toggle
        Valid(
            """\
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(net)
for micro_step in range(gradient_accumulation_steps):
    model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
    loss = model(x, y)
    loss.backward()
    if (micro_step + 1) % gradient_accumulation_steps == 0:
        optimizer.step()
"""
        ),
        # accumulation of exactly one step
        Valid(
            """\
from torch.nn.parallel import DistributedDataParallel

ACCUM_STEPS = 1
model = DistributedDataParallel(net)
for step, (x, y) in enumerate(loader):
    criterion(model(x), y).backward()
    if (step + 1) % ACCUM_STEPS == 0:
        optimizer.step()
        optimizer.zero_grad()
"""
        ),
        # FSDP is LD104's
        Valid(
            """\
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.nn.parallel import DistributedDataParallel

model = FullyShardedDataParallel(net)
for step, (x, y) in enumerate(loader):
    criterion(model(x), y).backward()
    if (step + 1) % accum_steps == 0:
        optimizer.step()
"""
        ),
        # a GAN: the discriminator steps every batch, the generator every `accum_steps`
        Valid(
            """\
from torch.nn.parallel import DistributedDataParallel as DDP

generator, discriminator = DDP(gen), DDP(disc)
for step, real in enumerate(loader):
    d_loss = critic_loss(discriminator, generator, real)
    d_loss.backward()
    d_optimizer.step()
    d_optimizer.zero_grad()
    g_loss = -discriminator(generator(noise())).mean()
    g_loss.backward()
    if (step + 1) % accum_steps == 0:
        g_optimizer.step()
        g_optimizer.zero_grad()
"""
        ),
        # the step follows every backward: no accumulation
        Valid(
            """\
from torch.nn.parallel import DistributedDataParallel

model = DistributedDataParallel(net)
for step, (x, y) in enumerate(loader):
    criterion(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad()
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(net)
for step, (x, y) in enumerate(loader):
    x = x.to(device)
    out = model(x)
    loss = criterion(out, y) / accum_steps
    loss.backward()
    if (step + 1) % accum_steps == 0:
        optimizer.step()
        optimizer.zero_grad()
""",
            lines=(8,),
            fixed="""\
from torch.nn.parallel import DistributedDataParallel as DDP
from lintdist.runtime import grad_sync

model = DDP(net)
for step, (x, y) in enumerate(loader):
    x = x.to(device)
    with grad_sync(model, sync=(step + 1) % accum_steps == 0):
        out = model(x)
        loss = criterion(out, y) / accum_steps
        loss.backward()
    if (step + 1) % accum_steps == 0:
        optimizer.step()
        optimizer.zero_grad()
""",
        ),
        # a helper runs the forward and the backward; a counter gates the step
        Invalid(
            """\
import torch.nn.parallel


def forward_backward(net, batch):
    loss = net(batch).mean()
    loss.backward()


def train(ddp_model, loader, optimizer, grad_accum):
    micro = 0
    for batch in loader:
        micro += 1
        forward_backward(ddp_model, batch)
        if micro == grad_accum:
            optimizer.step()
            optimizer.zero_grad()
            micro = 0


train(torch.nn.parallel.DistributedDataParallel(model), loader, optimizer, 4)
""",
            lines=(13,),
            fixed="""\
import torch.nn.parallel
from lintdist.runtime import grad_sync


def forward_backward(net, batch):
    loss = net(batch).mean()
    loss.backward()


def train(ddp_model, loader, optimizer, grad_accum):
    micro = 0
    for batch in loader:
        micro += 1
        with grad_sync(ddp_model, sync=micro == grad_accum):
            forward_backward(ddp_model, batch)
        if micro == grad_accum:
            optimizer.step()
            optimizer.zero_grad()
            micro = 0


train(torch.nn.parallel.DistributedDataParallel(model), loader, optimizer, 4)
""",
        ),
        # the counter is bumped after the backward: no fix (the gate would be read before it changes)
        Invalid(
            """\
from torch.nn.parallel import DistributedDataParallel

model = DistributedDataParallel(net)
micro = 0
for x, y in loader:
    criterion(model(x), y).backward()
    micro += 1
    if micro % accumulation_steps == 0:
        optimizer.step()
        optimizer.zero_grad()
""",
            lines=(6,),
        ),
        # an inner accumulation loop, the step after it
        Invalid(
            """\
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(net)
for iteration in range(max_iters):
    for micro_step in range(grad_accum):
        x, y = next(batches)
        loss = model(x, y) / grad_accum
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
""",
            lines=(8,),
            fixed="""\
from torch.nn.parallel import DistributedDataParallel as DDP
from lintdist.runtime import grad_sync

model = DDP(net)
for iteration in range(max_iters):
    for micro_step in range(grad_accum):
        x, y = next(batches)
        with grad_sync(model, sync=micro_step == grad_accum - 1):
            loss = model(x, y) / grad_accum
            loss.backward()
    optimizer.step()
    optimizer.zero_grad()
""",
        ),
        # a step after the loop for the partial window: no fix
        Invalid(
            """\
from torch.nn.parallel import DistributedDataParallel

model = DistributedDataParallel(net)
for epoch in range(epochs):
    for i, (x, y) in enumerate(loader):
        criterion(model(x), y).backward()
        if (i + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
    optimizer.step()
    optimizer.zero_grad()
""",
            lines=(6,),
        ),
    )

    def finish(self) -> None:
        if not self._raw_ddp():
            return
        self._reported: set[int] = set()
        loop = self.loop
        for toggle in loop.sync_toggles:
            self._late_toggle(toggle)
        if loop.sync_each_batch or loop.sync_toggles:
            return
        for site in loop.backward_sites:
            if site.kind not in RAW_BACKWARDS:
                continue
            window = backward_window(loop, site.call, MAX_HELPER_DEPTH)
            if window is not None and not sync_managed(loop, window, site.call):
                self._report(site, window)

    def _late_toggle(self, toggle: cst.CSTNode) -> None:
        """``model.require_backward_grad_sync = <gate>`` set between a forward of ``model`` and the backward, in
        one block: torch 2.13's DDP reads the flag in ``_pre_forward``/``_post_forward`` (where it arms the
        reducer for the backward), so the value acts one micro-batch late."""
        facts = self.facts
        if not isinstance(toggle, cst.Assign) or len(toggle.targets) != 1:
            return
        target = toggle.targets[0].target
        model = get_full_name_for_node(target.value) if isinstance(target, cst.Attribute) else None
        statement = facts.parent(toggle)
        block = facts.parent(statement) if statement is not None else None
        if model is None or not isinstance(block, (cst.IndentedBlock, cst.Module)):
            return
        body = list(block.body)
        index = body.index(statement)
        runs = [s for s in body[:index] if any(get_full_name_for_node(c.func) == model for c in facts.calls_within(s))]
        if not runs or not any(self.loop.backward_site(c) for s in body[index + 1 :] for c in facts.calls_within(s)):
            return
        first = runs[0]
        fix = None
        if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
            fix = Fix(
                Applicability.SAFE,
                "Set the flag before the forward",
                replacements=(
                    (first, cst.FlattenSentinel([statement, first])),
                    (statement, cst.RemovalSentinel.REMOVE),
                ),
            )
        line = self.context.span(first).line
        message = (
            f"`{model}.require_backward_grad_sync` is set after the forward at line {line}: DDP reads it in the "
            "forward (torch 2.13 `_pre_forward`/`_post_forward`), where it prepares the backward's all-reduce, so "
            "each value acts one micro-batch late: the first micro-batch of a window syncs and the last does not, "
            "and the gradients are never averaged across ranks at the step; set it before the forward"
        )
        self.report(toggle, message, severity=Severity.ERROR, fix=fix)

    # -- scope ---------------------------------------------------------------------------------

    def _raw_ddp(self) -> bool:
        """The file wraps a model in DistributedDataParallel (itself, or through a helper of another project
        module) and hands the loop to no framework; FSDP in the same file is LD104's concern."""
        facts = self.facts
        built = module_wrapper_kinds(facts)
        if (
            "ddp" not in built
            and not wrapped_parameters_run(facts)
            and not (self._accumulates_by_hand() and wraps_elsewhere(facts))
        ):
            return False
        if any(module.split(".", 1)[0] in FRAMEWORKS for module in facts.imported_modules):
            return False
        return built <= {"ddp"} and not any(facts.callee_is(call, ACCELERATOR_CLASSES) for call in facts.calls)

    def _accumulates_by_hand(self) -> bool:
        """A plain backward and an optimizer step under an accumulation gate: what is worth asking other modules
        about (most files of a library have neither)."""
        raw = [site for site in self.loop.backward_sites if site.kind in RAW_BACKWARDS]
        return bool(raw) and (
            bool(gated_steps(self.loop, MAX_HELPER_DEPTH))
            or any(loop_window(self.loop, site.call, MAX_HELPER_DEPTH) for site in raw)
        )

    # -- the report -------------------------------------------------------------------------------

    def _report(self, site: BackwardSite, window: Window) -> None:
        if id(window.anchor) in self._reported:
            return  # one finding per call in the window, however many backwards its helper holds
        self._reported.add(id(window.anchor))
        code = self.context.module.code_for_node
        if window.gate is not None:
            where = f"under `if {_short(code(window.gate.node.test))}:`"
        else:
            inner = window.inner.node
            where = f"after the loop `for {_short(code(inner.target))} in {_short(code(inner.iter))}:`"
        fix, model = self._fix(site, window)
        model_text = model or "model"
        this = "this backward"
        if window.helpers:
            this = f"the backward this call runs (line {self.context.span(site.call).line})"
        message = (
            f"DDP all-reduces the gradients in {this} on every micro-batch, but the optimizer steps only "
            f"{where}; run the forward and backward of the other micro-batches under `{model_text}.no_sync()`, "
            f"e.g. `with grad_sync({model_text}, sync=<last micro-batch of the step>):` from `lintdist.runtime`"
        )
        if fix is None and steps_outside(self.loop, window):
            message += (
                " (and sync the micro-batch before every other optimizer step, such as one after the loop for a "
                "last partial window)"
            )
        elif unstepped_tail(self.loop, window):
            message += (
                f". When the number of batches is not a multiple of the accumulation steps, the last micro-batches "
                f"of each pass over `{_short(code(loop_iterable(window.loop)))}` are never stepped: their gradients "
                "carry over into the next epoch's first step"
            )
        self.report(window.anchor, message, fix=fix)

    # -- the fix ----------------------------------------------------------------------------------

    def _fix(self, site: BackwardSite, window: Window) -> tuple[Fix | None, str | None]:
        facts = self.facts
        run = self._run(site, window)
        if run is None:
            return None, None
        statements, model = run[0], self.context.module.code_for_node(run[1])
        if not self.context.runtime_name_free("grad_sync"):
            return None, model
        if window.gate is not None:
            gate = window.gate.node
            order = facts.index.order
            if not facts.index.end(statements[-1]) <= order(gate) or not repeatable(facts, gate.test):
                return None, model
            container = facts.enclosing_function(gate) or self.context.module
            if rebound_between(facts, read_names(facts, gate.test), container, order(statements[0]), order(gate)):
                return None, model
            condition = gate.test.deep_clone()
        else:
            condition = last_iteration(self.loop, window.inner)
            if condition is None:
                return None, model
        if steps_outside(self.loop, window) or reads_unsynced_gradients(self.loop, window):
            return None, model
        item = cst.parse_expression(f"grad_sync({model}, sync=0)")
        item = item.deep_replace(item.args[1].value, condition)
        fix = Fix(
            Applicability.SAFE,
            f"Run the forward and backward under `grad_sync({model}, sync=...)`, syncing on the step's micro-batch",
            replacements=with_block(statements, item),
            imports=(("lintdist.runtime", "grad_sync"),),
        )
        return fix, model

    def _run(self, site: BackwardSite, window: Window) -> tuple[list[cst.BaseStatement], cst.BaseExpression] | None:
        """The statements of one block from the model's forward to the statement running the backward, which runs
        unconditionally there, and the model."""
        facts = self.facts
        chain = [site.call, *reversed(window.helpers)]  # backward first, then outwards to the anchor
        # inside each helper, the backward (or the next helper call) must run whenever the helper does
        for inner in chain[:-1]:
            function = facts.enclosing_function(inner)
            if function is None or not runs_whenever(facts, inner, function.body):
                return None
        return forward_run(facts, window.anchor)


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 60 else text[:57] + "..."
