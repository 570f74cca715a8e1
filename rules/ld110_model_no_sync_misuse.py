"""LD110 model-no-sync-misuse: `model.no_sync()` on an accelerate-prepared model, and no_sync blocks that hold a
backward but not its forward."""

from __future__ import annotations

import libcst as cst

from lintdist.deepspeed_settings import zero_stage
from lintdist.edits import module_import
from lintdist.loop import NoSync
from lintdist.model import Applicability, Fix, Severity
from lintdist.model_use import runs_or_passes
from lintdist.rule import Invalid, Rule, Valid
from lintdist.wrappers import is_wrapped


class ModelNoSyncMisuse(Rule):
    """
    ## What it does
    Reports two misuses of DDP's `no_sync`:
    (a) `model.no_sync` on a model that came from `accelerator.prepare(...)`,
    called (`with model.no_sync():`) or passed around
    (`ctx = model.no_sync if not last else nullcontext`); and
    (b) a `no_sync` block (`model.no_sync()`, `accelerator.no_sync(model)` or
    `lintdist.runtime.grad_sync(model, ...)`) that runs a backward pass but
    no forward pass of that model, on a DDP model (raw DDP, or accelerate
    without an FSDP or DeepSpeed backend). The block may be entered through
    a name (`ctx = model.no_sync() if not last else nullcontext()` ...
    `with ctx:`), and the model may be an attribute set in another method,
    by `DistributedDataParallel(...)` or by a helper: one lintdist reads in
    this module or another of the project, or, when its body is not in
    sight, one named for DDP (`init_distributed_data_parallel_model(...)`,
    `wrap_ddp(...)`).

    ## Why is this bad?
    (a) What a prepared model is depends on the launch: a DDP module under
    multi-GPU or multi-CPU, an FSDP2 module (which has no `no_sync`: an
    `AttributeError`), a DeepSpeed engine (whose `no_sync` asserts that ZeRO
    is below stage 2) or the plain model on one process (no `no_sync` either).
    `accelerator.no_sync(model)` handles each: DDP's `no_sync`,
    `set_requires_gradient_sync(False)` for FSDP2, nothing for DeepSpeed ZeRO
    2/3 or a single process. It is an error when the script's backend is known
    to be FSDP2 or DeepSpeed ZeRO 2/3, a warning otherwise.
    (b) DDP decides in the forward pass whether the next backward all-reduces
    (the `no_sync` docstring: "The forward pass should be included inside the
    context manager, or else gradients will still be synchronized"). A block
    that holds only the backward saves no communication: every micro-batch is
    still all-reduced. (FSDP and DeepSpeed decide in the backward, so they are
    not reported.)

    ## Example
    ```python
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for step, batch in enumerate(loader):
        outputs = model(**batch)
        with model.no_sync():
            accelerator.backward(outputs.loss)
    ```

    ## Use instead
    ```python
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for step, batch in enumerate(loader):
        with accelerator.no_sync(model):
            outputs = model(**batch)
            accelerator.backward(outputs.loss)
    ```

    ## Fix safety
    (a) is fixed safely: `model.no_sync()` becomes `accelerator.no_sync(model)`
    and an uncalled `model.no_sync` becomes
    `functools.partial(accelerator.no_sync, model)` (importing `functools`),
    when an accelerator is in scope there. For DDP this is the same context
    manager; for FSDP2, DeepSpeed and one process it is the one that works.
    (b) has no fix: moving the forward into the block changes which statements
    run under it, which lintdist leaves to you.

    ## References
    - `accelerate.Accelerator.no_sync` (FSDP2: `set_requires_gradient_sync`;
      DeepSpeed ZeRO >= 2: `nullcontext`)
    - `torch.nn.parallel.DistributedDataParallel.no_sync` docstring
    - accelerate guide "Gradient synchronization"
    - facebookresearch/ClassyVision pull request #706: `no_sync()` entered
      around the backward only, so accumulation still synchronized
    """

    code = "LD110"
    name = "model-no-sync-misuse"
    severity = Severity.WARNING
    fix_kind = "safe"
    triggers = ("no_sync", "grad_sync")

    VALID = (
        Valid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
model, optimizer = accelerator.prepare(model, optimizer)
for step, batch in enumerate(loader):
    with accelerator.no_sync(model):
        accelerator.backward(model(**batch).loss)
"""
        ),
        # raw DDP with the forward inside: the intended use
        Valid(
            """\
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(net)
with model.no_sync():
    loss = model(x).sum()
    loss.backward()
"""
        ),
        # FSDP decides at backward time: a backward-only block does skip the reduction
        Valid(
            """\
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

model = FSDP(net)
out = model(x)
with model.no_sync():
    out.sum().backward()
"""
        ),
        # the forward runs in a helper called inside the block
        Valid(
            """\
from torch.nn.parallel import DistributedDataParallel as DDP


def compute(m, batch):
    return m(batch).sum()


model = DDP(net)
with model.no_sync():
    compute(model, x).backward()
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
model, optimizer = accelerator.prepare(model, optimizer)
for step, batch in enumerate(loader):
    with model.no_sync():
        accelerator.backward(model(**batch).loss)
""",
            lines=(6,),
            fixed="""\
from accelerate import Accelerator

accelerator = Accelerator()
model, optimizer = accelerator.prepare(model, optimizer)
for step, batch in enumerate(loader):
    with accelerator.no_sync(model):
        accelerator.backward(model(**batch).loss)
""",
        ),
        Invalid(
            """\
from contextlib import nullcontext

from accelerate import Accelerator

accelerator = Accelerator()
model, optimizer = accelerator.prepare(model, optimizer)
for step, batch in enumerate(loader):
    ctx = model.no_sync if (step + 1) % 4 != 0 else nullcontext
    with ctx():
        accelerator.backward(model(**batch).loss)
""",
            lines=(8,),
            fixed="""\
from contextlib import nullcontext

from accelerate import Accelerator
import functools

accelerator = Accelerator()
model, optimizer = accelerator.prepare(model, optimizer)
for step, batch in enumerate(loader):
    ctx = functools.partial(accelerator.no_sync, model) if (step + 1) % 4 != 0 else nullcontext
    with ctx():
        accelerator.backward(model(**batch).loss)
""",
        ),
        # (b): the forward ran before the block
        Invalid(
            """\
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(net)
for step, (x, y) in enumerate(loader):
    loss = criterion(model(x), y)
    if (step + 1) % accum != 0:
        with model.no_sync():
            loss.backward()
    else:
        loss.backward()
        optimizer.step()
""",
            lines=(7,),
        ),
    )

    def finish(self) -> None:
        self._prepared_no_sync()
        self._backward_only_blocks()

    # -- (a) model.no_sync on a prepared model ------------------------------------------------------

    def _prepared_no_sync(self) -> None:
        facts = self.facts
        for attribute in facts.index.nodes(cst.Attribute):
            if attribute.attr.value != "no_sync":
                continue
            receiver = attribute.value
            if not isinstance(receiver, (cst.Name, cst.Attribute)) or facts.is_accelerator(receiver, attribute):
                continue
            parent = facts.parent(attribute)
            if isinstance(parent, (cst.AssignTarget, cst.Del)) or (
                isinstance(parent, (cst.AugAssign, cst.AnnAssign)) and parent.target is attribute
            ):
                continue
            # the ``accelerator.prepare(...)`` / ``prepare_model(...)`` call the receiver's value came from
            prepare = next(
                (o.node for o in facts.origins(receiver, attribute) if self.loop.is_accelerate_prepare(o.node)), None
            )
            if prepare is not None:
                self._report_prepared(attribute, receiver, prepare)

    def _report_prepared(self, attribute: cst.Attribute, receiver: cst.BaseExpression, prepare: cst.Call) -> None:
        facts = self.facts
        code = self.context.module.code_for_node
        model = code(receiver)
        accelerator = self._accelerator_at(attribute, prepare)
        shown = accelerator or "accelerator"
        parent = facts.parent(attribute)
        called = isinstance(parent, cst.Call) and parent.func is attribute
        fatal = self._fatal_backend()
        if called:
            node, replacement = parent, f"{shown}.no_sync({model})"
        else:
            node, replacement = attribute, f"functools.partial({shown}.no_sync, {model})"
        why = (
            f"under {fatal} the prepared model has no working `no_sync`"
            if fatal
            else "a prepared model has a working `no_sync` only as a DDP, FSDP1 or DeepSpeed ZeRO 0/1 module (run "
            "on one process or under FSDP2 it has none; under ZeRO 2/3 it asserts)"
        )
        message = f"`{model}` came from `accelerator.prepare` and {why}; use `{replacement}`"
        fix = None
        if accelerator is not None and (called and not parent.args or not called):
            fix = self._fix(node, replacement, called)
        self.report(node, message, fix=fix, severity=Severity.ERROR if fatal else None)

    def _fix(self, node: cst.CSTNode, replacement: str, called: bool) -> Fix | None:
        imports = () if called else module_import(self.context.names.module_bindings("functools"), "functools")
        if imports is None:
            return None  # `functools` is some other name here
        new = cst.parse_expression(replacement)
        if isinstance(node, (cst.Call, cst.Attribute)):
            new = new.with_changes(lpar=node.lpar, rpar=node.rpar)
        return Fix(Applicability.SAFE, f"Use `{replacement}`", replacements=((node, new),), imports=imports)

    def _accelerator_at(self, at: cst.CSTNode, prepare: cst.Call) -> str | None:
        """An expression for the Accelerator that is valid where ``at`` is: the one that prepared the model when its
        name means it there, else the facts' Accelerator in sight (``facts.accelerator_at``)."""
        facts = self.facts
        receiver = prepare.func.value
        if isinstance(receiver, (cst.Name, cst.Attribute)):
            text = self.context.module.code_for_node(receiver)
            if facts.is_accelerator(cst.parse_expression(text), at):
                return text
        return facts.accelerator_at(at)

    def _fatal_backend(self) -> str | None:
        """ "FSDP2" or "DeepSpeed ZeRO 2/3" when the code or the launch says so; None otherwise."""
        backend = self.loop.backend
        if backend == "FSDP" and self.loop.fsdp_version == 2:
            return "FSDP2"
        if backend == "DEEPSPEED":
            stage = zero_stage(self.facts, self.context.settings)
            if stage is not None and stage >= 2:
                return f"DeepSpeed ZeRO stage {stage}"
        return None

    # -- (b) a no_sync block with a backward but no forward -------------------------------------------

    def _backward_only_blocks(self) -> None:
        facts = self.facts
        loop = self.loop
        reported: set[int] = set()
        for block in loop.no_sync_blocks:
            if block.kind not in {"model", "accelerator", "grad_sync"} or block.model is None:
                continue
            if id(block.node) in reported:
                continue
            ddp, identified = self._decides_in_forward(block)
            if ddp is False:
                continue
            calls = facts.reachable_calls(block.node.body)
            backwards = [c for c in calls if (s := loop.backward_site(c)) is not None and s.kind != "engine"]
            if not backwards or runs_or_passes(facts, calls, block.model, block.node):
                continue
            reported.add(id(block.node))
            model = self.context.module.code_for_node(block.model)
            if ddp is None:  # a snippet's `model.no_sync()`: FSDP1 reads the flag in the backward and would be right
                known = f": if `{model}` is a DDP model (nothing in sight says what wraps it), DDP"
            else:
                known = (f" ({identified})" if identified else "") + ": DDP"
            where = block.call if facts.is_within(block.call, block.node) else block.node.items[0].item
            self.report(
                where,
                f"this no_sync block runs a backward but no forward of `{model}`{known} decides in the forward "
                "whether the backward all-reduces, so the gradients are still synchronized on every micro-batch; "
                "move the forward pass into the block",
                severity=Severity.INFO if ddp is None else None,
            )

    def _decides_in_forward(self, block: NoSync) -> tuple[bool | None, str | None]:
        """Whether the model is a DDP module, and the evidence to name when a snippet's use of it or the name of
        the helper that made it says so: wrapped here (or by a helper named for DDP whose body is not in sight), or
        prepared by accelerate with no FSDP/DeepSpeed backend. None where nothing in sight binds the model at all
        (a snippet's bare ``model``): it may be DDP."""
        facts = self.facts
        origins = facts.origins(block.model, block.node)
        identified = facts.identified(block.model, block.node, "ddp")  # a snippet: `.no_sync()` and `.module`
        if is_wrapped(facts, block.model, block.node):
            return True, identified
        helper = next(
            (n for o in origins if isinstance(o.node, cst.Call) and (n := facts.named_ddp_helper(o.node))), None
        )
        if helper:
            return True, identified or f"made by `{helper}`, a helper named for DDP whose body is not in sight"
        if identified is not None:
            return True, identified
        if any(self.loop.is_accelerate_prepare(o.node) for o in origins):
            return self.loop.backend is None, None
        if block.kind == "model" and facts.unbound(block.model, block.node):
            return None, None
        return False, None
