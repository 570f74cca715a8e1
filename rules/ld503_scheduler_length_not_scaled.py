"""LD503 scheduler-length-not-scaled: a prepared LR scheduler sized in optimizer steps ends after 1/W of training."""

from __future__ import annotations

import re

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.accelerators import accelerator_calls, accelerator_option, prepared_arguments
from lintdist.arguments import command_line_default
from lintdist.closures import free_reads
from lintdist.edits import unparenthesized
from lintdist.facts import argument_of, string_value
from lintdist.launch import number
from lintdist.loop import is_accumulation_name
from lintdist.loop_bounds import bounding_test, loops_around
from lintdist.model import Applicability, Fix, Severity
from lintdist.reaching import divided_later, filled_when_missing, reads_passed_parameter
from lintdist.rule import Invalid, Rule, Valid
from lintdist.schedulers import (
    LAMBDA_SCHEDULERS,
    NO_LENGTH,
    schedule_function,
    scheduler_class,
    scheduler_length,
    scheduler_steps,
    scheduler_warmup,
)
from lintdist.step_counts import Count, StepCounts, read_scaled, unscaled_count

RUNTIME_IMPORT = ("lintdist.runtime", "scheduler_total_steps")
WRAPS = "`accelerator.prepare` wraps the scheduler so that it steps `num_processes` times per optimizer step"
UNSCALED = (
    "{what} counts optimizer steps ({why}), but " + WRAPS + ", and the schedule ends after {ends}; multiply it by "
    "the number of processes (`scheduler_total_steps(n, accelerator)`)"
)
MIXED = (
    "{what} counts optimizer steps when the count is given rather than derived ({why}), but " + WRAPS + ", and the "
    "schedule ends after {ends}; multiply the given count by `accelerator.num_processes` (a count derived from the "
    "loader before `prepare` counts un-sharded batches and needs no factor)"
)
ACCUMULATED = (
    "{what} counts optimizer steps times `gradient_accumulation_steps` ({why}), but " + WRAPS + " and not at all "
    "while gradients accumulate: the schedule ends after `gradient_accumulation_steps`/{world} of training, and does "
    "not finish when the accumulation is at least the number of processes; drop the accumulation factor and multiply "
    "the optimizer steps by the number of processes (`scheduler_total_steps(n, accelerator)`)"
)
# the count derived from the un-sharded loader needs no factor: the product is k times long
ACCUMULATED_MIXED = (
    "{what} is a step budget times `gradient_accumulation_steps` ({why}), but " + WRAPS + " and not at all while "
    "gradients accumulate: with a given budget the schedule ends after `gradient_accumulation_steps`/{world} of "
    "training (or never finishes, when the accumulation is at least the number of processes), and with a budget "
    "derived from the un-sharded loader before `prepare` it gets only 1/`gradient_accumulation_steps` of the way; "
    "drop the accumulation factor, and multiply a given budget by the number of processes "
    "(`scheduler_total_steps(n, accelerator)`)"
)


class SchedulerLengthNotScaled(Rule):
    """
    ## What it does
    Reports a learning-rate scheduler that goes through `accelerator.prepare`
    and whose total length (`num_training_steps` of a transformers or diffusers
    schedule, `total_iters`, `T_max`, `total_steps` or `steps_per_epoch` of a
    torch scheduler, or a step count read inside a `LambdaLR` lambda) counts
    optimizer steps without a factor of the number of processes: it comes from
    the length of the *prepared* (already sharded) loader, or from a step count
    that bounds the loop that steps the scheduler (`if completed_steps >=
    args.max_train_steps: break`, or `T_max=args.epochs` for a scheduler stepped
    once per epoch). A length computed from the loader before `prepare` is not
    reported: that one counts the un-sharded batches, which is what accelerate
    expects. Nor are a length that involves `num_processes` or a world size, an
    `Accelerator(step_scheduler_with_optimizer=False)`, a
    `DataLoaderConfiguration(split_batches=True)`, a scheduler DeepSpeed builds
    from its config (`DummyScheduler`), a scheduler that is not prepared, and a
    launch that runs one process.

    ## Why is this bad?
    `accelerator.prepare` wraps a torch scheduler in `AcceleratedScheduler`,
    whose `step()` steps the wrapped scheduler `num_processes` times per
    optimizer step (unless `split_batches` or `step_scheduler_with_optimizer=False`):
    accelerate assumes the length was counted on the un-sharded loader, which is
    `num_processes` times longer than each rank's. A length in optimizer steps
    therefore runs out after 1/`num_processes` of training: with 8 processes a
    linear decay reaches 0 after one eighth of the steps, and the rest of
    training runs at the final learning rate (or restarts, for cyclic ones). The
    warmup is shortened the same way. This holds under DeepSpeed too for torch
    schedulers (`LambdaLR`...), which are wrapped the same way. `split_batches=`
    given to `Accelerator(...)` itself is ignored by accelerate 1.x: only
    `DataLoaderConfiguration(split_batches=True)` is read.

    ## Example
    ```python
    model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
    max_train_steps = args.num_train_epochs * len(train_dataloader)
    lr_scheduler = get_scheduler(
        "linear", optimizer, num_warmup_steps=100, num_training_steps=max_train_steps
    )
    lr_scheduler = accelerator.prepare(lr_scheduler)
    ```

    ## Use instead
    ```python
    from lintdist.runtime import scheduler_total_steps

    model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
    max_train_steps = args.num_train_epochs * len(train_dataloader)
    lr_scheduler = get_scheduler(
        "linear",
        optimizer,
        num_warmup_steps=scheduler_total_steps(100, accelerator),
        num_training_steps=scheduler_total_steps(max_train_steps, accelerator),
    )
    lr_scheduler = accelerator.prepare(lr_scheduler)
    ```
    (`scheduler_total_steps(n, accelerator)` is `n * accelerator.num_processes`,
    or `n` under `split_batches` or `step_scheduler_with_optimizer=False`.)
    Building the scheduler from the loader *before* `prepare`, or keeping it
    out of `prepare` and stepping it yourself, is right as well.

    ## Fix safety
    Unsafe: it changes the learning rate of every step after the first
    1/`num_processes` of training, which is the point, but also the results a
    run reproduces. The fix wraps the length (and a warmup given in the same
    call, unless it already involves the number of processes) in
    `lintdist.runtime.scheduler_total_steps(x, accelerator)`, which reads
    `split_batches`, `step_scheduler_with_optimizer` and `num_processes` at run
    time, and adds that import. In a `LambdaLR` lambda it wraps the step count
    the lambda reads. When the length can also come from the un-sharded loader
    (`if args.max_train_steps is None: args.max_train_steps = epochs *
    ceil(len(loader) / accumulation)` before `prepare`), only the branch where
    the user gives `--max_train_steps` is wrong: the fix gives that `if` an
    `else:`, and both branches set the scheduler's own length
    (`max_train_steps_for_scheduler`: the derived count as it is, the given
    one through `scheduler_total_steps`), which the scheduler then reads; the
    loop's bound keeps counting optimizer steps. That fix needs the test to be
    `x is None` or `not x`, the `if` to have no `else`, and the Accelerator to
    be bound before it. There is no fix in a helper that receives the length as a parameter
    (its other callers would change too: scale the argument at the call),
    when the length is multiplied by `gradient_accumulation_steps` (that factor
    must go rather than be wrapped: the schedule then ends after
    `gradient_accumulation_steps`/`num_processes` of training, or never
    finishes, and the message says so), and when no Accelerator is in sight
    where the scheduler is built.

    ## References
    - accelerate `AcceleratedScheduler.step` (`accelerate/scheduler.py`)
    - accelerate issues #2926, #2318, #1382, #628, and #3177 (`Accelerator(split_batches=True)` ignored);
      transformers PR #24088; diffusers #3954, #8384 and PR #8312 (the
      `len_train_dataloader_after_sharding` pattern)
    """

    code = "LD503"
    name = "scheduler-length-not-scaled"
    severity = Severity.WARNING
    fix_kind = "unsafe"
    triggers = ("prepare",)
    also_triggers = (
        (
            "num_training_steps",
            "total_iters",
            "T_max",
            "total_steps",
            "steps_per_epoch",
            "LambdaLR",
            "_schedule_with_warmup",
            "get_scheduler",
        ),
    )

    VALID = (
        # the accelerate examples: the length counts the un-sharded loader, before prepare
        Valid(
            """\
from accelerate import Accelerator
from transformers import get_linear_schedule_with_warmup

accelerator = Accelerator()
train_dataloader = DataLoader(dataset, batch_size=16, shuffle=True)
lr_scheduler = get_linear_schedule_with_warmup(
    optimizer, num_warmup_steps=100, num_training_steps=len(train_dataloader) * num_epochs
)
model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
    model, optimizer, train_dataloader, lr_scheduler
)
for epoch in range(num_epochs):
    for batch in train_dataloader:
        accelerator.backward(model(**batch).loss)
        optimizer.step()
        lr_scheduler.step()
"""
        ),
        # the diffusers pattern: optimizer steps times num_processes
        Valid(
            """\
from accelerate import Accelerator
from diffusers.optimization import get_scheduler

accelerator = Accelerator()
unet, optimizer, train_dataloader = accelerator.prepare(unet, optimizer, train_dataloader)
lr_scheduler = get_scheduler(
    args.lr_scheduler,
    optimizer=optimizer,
    num_warmup_steps=args.lr_warmup_steps * accelerator.num_processes,
    num_training_steps=args.max_train_steps * accelerator.num_processes,
)
lr_scheduler = accelerator.prepare(lr_scheduler)
for step, batch in enumerate(train_dataloader):
    optimizer.step()
    lr_scheduler.step()
    global_step += 1
    if global_step >= args.max_train_steps:
        break
"""
        ),
        # split_batches: one inner step per optimizer step
        Valid(
            """\
from accelerate import Accelerator, DataLoaderConfiguration
from torch.optim.lr_scheduler import CosineAnnealingLR

accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=True))
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
scheduler = accelerator.prepare(CosineAnnealingLR(optimizer, T_max=len(loader) * epochs))
for epoch in range(epochs):
    for batch in loader:
        optimizer.step()
        scheduler.step()
"""
        ),
        # the scheduler is stepped by the script, not prepared
        Valid(
            """\
from accelerate import Accelerator
from torch.optim.lr_scheduler import CosineAnnealingLR

accelerator = Accelerator()
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
scheduler = CosineAnnealingLR(optimizer, T_max=len(loader) * epochs)
for epoch in range(epochs):
    for batch in loader:
        optimizer.step()
        scheduler.step()
"""
        ),
        # step_scheduler_with_optimizer=False: the wrapper steps once per call
        Valid(
            """\
from accelerate import Accelerator
from transformers import get_cosine_schedule_with_warmup

accelerator = Accelerator(step_scheduler_with_optimizer=False)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
scheduler = get_cosine_schedule_with_warmup(optimizer, 10, len(loader) * epochs)
scheduler = accelerator.prepare(scheduler)
for epoch in range(epochs):
    for batch in loader:
        optimizer.step()
        scheduler.step()
"""
        ),
        # DeepSpeed builds the scheduler from its config
        Valid(
            """\
from accelerate import Accelerator
from accelerate.utils import DummyOptim, DummyScheduler

accelerator = Accelerator()
model, loader = accelerator.prepare(model, loader)
optimizer = DummyOptim(model.parameters(), lr=1e-4)
scheduler = DummyScheduler(optimizer, total_num_steps=len(loader) * epochs, warmup_num_steps=10)
model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
from accelerate import Accelerator
from transformers import get_scheduler

accelerator = Accelerator()
model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
max_train_steps = args.num_train_epochs * len(train_dataloader)
lr_scheduler = get_scheduler(
    "linear", optimizer, num_warmup_steps=100, num_training_steps=max_train_steps
)
lr_scheduler = accelerator.prepare(lr_scheduler)
""",
            lines=(8,),
            unsafe_fixed="""\
from accelerate import Accelerator
from transformers import get_scheduler
from lintdist.runtime import scheduler_total_steps

accelerator = Accelerator()
model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
max_train_steps = args.num_train_epochs * len(train_dataloader)
lr_scheduler = get_scheduler(
    "linear", optimizer, num_warmup_steps=scheduler_total_steps(100, accelerator), num_training_steps=scheduler_total_steps(max_train_steps, accelerator)
)
lr_scheduler = accelerator.prepare(lr_scheduler)
""",
        ),
        # a step count that bounds the loop
        Invalid(
            """\
import torch
from accelerate import Accelerator

accelerator = Accelerator()
scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.0, total_iters=args.max_steps)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
step = 0
while step < args.max_steps:
    for batch in loader:
        accelerator.backward(model(batch).mean())
        optimizer.step()
        scheduler.step()
        step += 1
""",
            lines=(5,),
            unsafe_fixed="""\
import torch
from accelerate import Accelerator
from lintdist.runtime import scheduler_total_steps

accelerator = Accelerator()
scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.0, total_iters=scheduler_total_steps(args.max_steps, accelerator))
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
step = 0
while step < args.max_steps:
    for batch in loader:
        accelerator.backward(model(batch).mean())
        optimizer.step()
        scheduler.step()
        step += 1
""",
        ),
        # a per-epoch schedule: each epoch's `step()` steps it `num_processes` times too
        Invalid(
            """\
from accelerate import Accelerator
from torch.optim.lr_scheduler import CosineAnnealingLR

accelerator = Accelerator()
scheduler = CosineAnnealingLR(optimizer, T_max=args.epochs)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
for epoch in range(args.epochs):
    for batch in loader:
        accelerator.backward(model(batch).mean())
        optimizer.step()
    scheduler.step()
""",
            lines=(5,),
            unsafe_fixed="""\
from accelerate import Accelerator
from torch.optim.lr_scheduler import CosineAnnealingLR
from lintdist.runtime import scheduler_total_steps

accelerator = Accelerator()
scheduler = CosineAnnealingLR(optimizer, T_max=scheduler_total_steps(args.epochs, accelerator))
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
for epoch in range(args.epochs):
    for batch in loader:
        accelerator.backward(model(batch).mean())
        optimizer.step()
    scheduler.step()
""",
        ),
        # a helper builds the scheduler from what its caller passes
        Invalid(
            """\
from accelerate import Accelerator
from transformers import get_cosine_schedule_with_warmup


def build_scheduler(optimizer, total):
    return get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=0, num_training_steps=total)


accelerator = Accelerator()
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
scheduler = accelerator.prepare(build_scheduler(optimizer, len(loader) * 3))
""",
            lines=(6,),
        ),
        # the no_trainer shape: right when the count is derived from the un-sharded loader, wrong when it is given
        Invalid(
            """\
import math
from accelerate import Accelerator
from torch.utils.data import DataLoader
from transformers import get_scheduler

accelerator = Accelerator()
train_dataloader = DataLoader(train_dataset, batch_size=8, shuffle=True)
num_update_steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
if args.max_train_steps is None:
    args.max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
lr_scheduler = get_scheduler(
    name=args.lr_scheduler_type,
    optimizer=optimizer,
    num_warmup_steps=args.num_warmup_steps,
    num_training_steps=args.max_train_steps,
)
model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
    model, optimizer, train_dataloader, lr_scheduler
)
completed_steps = 0
for epoch in range(args.num_train_epochs):
    for batch in train_dataloader:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            lr_scheduler.step()
        if accelerator.sync_gradients:
            completed_steps += 1
        if completed_steps >= args.max_train_steps:
            break
""",
            lines=(15,),
            unsafe_fixed="""\
import math
from accelerate import Accelerator
from torch.utils.data import DataLoader
from transformers import get_scheduler
from lintdist.runtime import scheduler_total_steps

accelerator = Accelerator()
train_dataloader = DataLoader(train_dataset, batch_size=8, shuffle=True)
num_update_steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
if args.max_train_steps is None:
    args.max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
    max_train_steps_for_scheduler = args.max_train_steps
else:
    max_train_steps_for_scheduler = scheduler_total_steps(args.max_train_steps, accelerator)
lr_scheduler = get_scheduler(
    name=args.lr_scheduler_type,
    optimizer=optimizer,
    num_warmup_steps=scheduler_total_steps(args.num_warmup_steps, accelerator),
    num_training_steps=max_train_steps_for_scheduler,
)
model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
    model, optimizer, train_dataloader, lr_scheduler
)
completed_steps = 0
for epoch in range(args.num_train_epochs):
    for batch in train_dataloader:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            lr_scheduler.step()
        if accelerator.sync_gradients:
            completed_steps += 1
        if completed_steps >= args.max_train_steps:
            break
""",
        ),
    )

    def finish(self) -> None:
        if self.loop.surely_single:
            return
        facts = self.facts
        seen: set[int] = set()
        for prepare, argument, target in prepared_arguments(facts):
            for origin in facts.origins(argument, prepare):
                call = origin.node
                if not isinstance(call, cst.Call) or origin.index is not None or id(call) in seen:
                    continue
                qualified = scheduler_class(facts, call)
                if qualified is None:
                    continue
                seen.add(id(call))
                if self._one_step_per_optimizer_step(prepare):
                    continue
                names = {n for n in (get_full_name_for_node(argument), target) if n}
                loops = loops_around(facts, scheduler_steps(facts, names))
                self._counts = StepCounts(facts, lambda key, loops=loops: bounding_test(facts, key, loops))
                self._prepare = prepare
                if qualified in LAMBDA_SCHEDULERS:
                    self._check_lambda(call, prepare)
                else:
                    self._check(call, qualified, prepare)

    def _one_step_per_optimizer_step(self, prepare: cst.Call) -> bool:
        """The Accelerator that prepares the scheduler steps it once per optimizer step, or may: a
        ``step_scheduler_with_optimizer`` that is not literally True, or a ``split_batches`` that is not literally
        False (an Accelerator made in another module does not count: its keywords are not in sight)."""
        facts = self.facts
        for accelerator in accelerator_calls(facts, prepare.func.value, prepare):
            if facts.stand_in_note(accelerator):
                continue
            if accelerator_option(facts, accelerator, "step_scheduler_with_optimizer") is not True:
                return True
            if accelerator_option(facts, accelerator, "split_batches") is not False:
                return True
        return False

    def _ignored_split_batches(self) -> cst.CSTNode | None:
        """``Accelerator(split_batches=...)``: a keyword accelerate 1.x accepts and never reads."""
        calls = accelerator_calls(self.facts, self._prepare.func.value, self._prepare)
        return next((arg for arg in (argument_of(c, "split_batches", None) for c in calls) if arg is not None), None)

    # -- the length ------------------------------------------------------------------------------

    def _check(self, call: cst.Call, qualified: str, prepare: cst.Call) -> None:
        found = scheduler_length(call, qualified)
        if found is None:
            return
        length_name, length = found
        key = get_full_name_for_node(length) if isinstance(length, (cst.Name, cst.Attribute)) else None
        bad, mixed = unscaled_count(self._counts.evaluate(length, call))
        if bad is None or self._shared_out_later(key, call):
            return
        replacements = []
        # a length a helper receives: its other callers would be changed too; the call site is the place
        helper = reads_passed_parameter(self.facts, length, call)
        accelerator = None if helper else self.loop.accelerator_at(prepare, call)
        if accelerator is not None and self.context.runtime_name_free("scheduler_total_steps"):
            replacements = (
                self._two_branch_fix(length, key, call, accelerator)
                if mixed
                else [(length, _wrapped(length, accelerator))]
            )
        warmup = scheduler_warmup(call, qualified)
        if replacements and warmup is not None and self._unscaled_warmup(warmup, call):
            # a warmup in optimizer steps is short by the same factor
            replacements.append((warmup, _wrapped(warmup, accelerator)))
        self._report(length, f"`{length_name}`", bad, mixed, replacements, self._lengthless_default(call, qualified))

    def _lengthless_default(self, call: cst.Call, qualified: str) -> str | None:
        """``get_scheduler(name=args.lr_scheduler, ...)`` where the script's own default for that argument is a
        schedule without a length (``--lr_scheduler constant``): the flag as the message names it, else None."""
        if not qualified.endswith("get_scheduler"):
            return None
        chosen = argument_of(call, "name", 0)
        default = string_value(command_line_default(self.facts, chosen)) if chosen is not None else None
        if default not in NO_LENGTH:
            return None
        return f"`--{chosen.attr.value} {default}`"

    def _shared_out_later(self, key: str | None, call: cst.Call) -> bool:
        """After the scheduler is built, the name its length reads is rebound to itself over the number of
        processes (``args.max_train_steps = math.ceil(args.max_train_steps / accelerator.num_processes)``, peft's
        AdaLoRA example): the loop then runs 1/W of the steps the schedule counts, which is what a prepared
        scheduler stepping W times per optimizer step needs."""
        return key is not None and any(
            v.world >= 1
            for divisor, statement in divided_later(self.facts, key, call)
            for v in self._counts.evaluate(divisor, statement)
        )

    def _two_branch_fix(self, length: cst.BaseExpression, key: str | None, call: cst.Call, accelerator: str) -> list:
        """The given-or-derived length (``if args.max_train_steps is None: args.max_train_steps = <from the
        un-sharded loader>``): only the given count needs the factor. Both branches set the scheduler's own length
        (the derived count as it is, the given one through ``scheduler_total_steps``), and the scheduler reads it,
        as the diffusers scripts do since their PR #8312. Empty when the shape is another."""
        found = filled_when_missing(self.facts, key, call) if key is not None else None
        if found is None:
            return []
        binding, branch = found
        if any(v.unknown or v.optimizer_steps for v in self._counts.evaluate(binding.value, binding.statement, 1)):
            return []
        own = re.sub(r"\W", "_", key.rsplit(".", 1)[-1]) + "_for_scheduler"
        if (
            re.search(rf"\b{own}\b", self.context.text)
            or self.loop.accelerator_at(self._prepare, branch) != accelerator
        ):
            return []  # the name is taken, or the Accelerator is not yet bound where the branches run
        derived = cst.parse_statement(f"{own} = {key}\n")
        given = cst.parse_statement(f"{own} = {cst.Module([]).code_for_node(_wrapped(length, accelerator))}\n")
        body = branch.body
        mended = branch.with_changes(
            body=body.with_changes(body=(*body.body, derived)),
            orelse=cst.Else(body=cst.IndentedBlock(body=(given,), indent=body.indent)),
        )
        return [(branch, mended), (length, cst.Name(own))]

    def _check_lambda(self, call: cst.Call, prepare: cst.Call) -> None:
        """``LambdaLR(optimizer, lr_lambda)``: a step count the lambda reads (a free name of an inline lambda or of
        a function of this file), unless one of its reads is already scaled."""
        facts = self.facts
        definition = schedule_function(facts, call)
        if definition is None:
            return
        at = call if facts.enclosing_function(definition) is facts.enclosing_function(call) else definition
        for key, nodes in free_reads(facts, definition).items():
            if any(read_scaled(self._counts, node, call) for node in nodes):
                continue
            bad, mixed = unscaled_count(self._counts.evaluate(nodes[0], at))
            if bad is None:
                continue
            replacements = []
            accelerator = self.loop.accelerator_at(prepare, definition) if not mixed else None
            if accelerator is not None and self.context.runtime_name_free("scheduler_total_steps"):
                replacements = [(node, _wrapped(node, accelerator)) for node in nodes]
            self._report(call, f"the step count `{key}` that its `lr_lambda` reads", bad, mixed, replacements)
            return

    def _unscaled_warmup(self, warmup: cst.BaseExpression, at: cst.CSTNode) -> bool:
        if isinstance(warmup, cst.Integer) and warmup.evaluated_value == 0:
            return False
        values = self._counts.evaluate(warmup, at)
        return bool(values) and all(not v.unknown and v.world <= 0 for v in values)

    def _report(
        self, where: cst.CSTNode, what: str, value: Count, mixed: bool, replacements, lengthless: str | None = None
    ) -> None:
        why = value.why
        if value.where is not None:
            why += f" at line {self.context.span(value.where).line}"
        processes = number(self.context.settings.get("num_processes")) if self.context.settings else None
        # A count multiplied by the accumulation steps is k times too long as well: the schedule then ends after
        # k/W of training, and not at all when k >= W (accelerate steps it only on the optimizer step).
        accumulated = isinstance(where, cst.BaseExpression) and any(
            isinstance(op.operator, cst.Multiply) and (is_accumulation_name(op.left) or is_accumulation_name(op.right))
            for op in self.facts.within(where, cst.BinaryOperation)
        )
        if accumulated:
            world = "`num_processes`" if processes is None else processes
            message = (ACCUMULATED_MIXED if mixed else ACCUMULATED).format(what=what, why=why, world=world)
            replacements = []  # wrapping the product would keep the accumulation factor: no fix
        else:
            ends = (
                f"1/{processes} of training (the launch runs {processes} processes)"
                if processes is not None
                else "1/`num_processes` of training (halfway with 2 processes)"
            )
            message = (MIXED if mixed else UNSCALED).format(what=what, why=why, ends=ends)
        ignored = self._ignored_split_batches()
        if ignored is not None:
            message += (
                f"; `split_batches=` given to `Accelerator(...)` at line {self.context.span(ignored).line} is ignored "
                "by accelerate 1.x (accelerate #3177): only `DataLoaderConfiguration(split_batches=True)` is read"
            )
        if lengthless is not None:
            message += (
                f"; with the script's default {lengthless} the schedule has no length and nothing ends early: this "
                "matters once a decaying schedule is chosen"
            )
        fix = None
        if replacements:
            fix = Fix(
                Applicability.UNSAFE,
                "Give the scheduler a length of its own: the derived count as it is, the given one through "
                "`scheduler_total_steps(..., accelerator)`"
                if mixed
                else "Wrap the scheduler's length in `scheduler_total_steps(..., accelerator)`",
                replacements=tuple(replacements),
                imports=(RUNTIME_IMPORT,),
            )
        self.report(where, message, fix=fix, severity=None if lengthless is None else Severity.INFO)


# -- helpers -------------------------------------------------------------------------------------------


def _wrapped(expr: cst.BaseExpression, accelerator: str) -> cst.Call:
    """``scheduler_total_steps(expr, accelerator)``, without parentheses of ``expr``'s own that the call makes
    redundant."""
    bare = expr if isinstance(expr, cst.Tuple) else unparenthesized(expr)
    return cst.Call(
        func=cst.Name("scheduler_total_steps"), args=(cst.Arg(bare), cst.Arg(cst.parse_expression(accelerator)))
    )
