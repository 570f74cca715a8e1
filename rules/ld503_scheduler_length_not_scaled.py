"""LD503 scheduler-length-not-scaled: a prepared LR scheduler sized in optimizer steps ends after 1/W of training."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import (
    ACCELERATOR_CLASSES,
    DATALOADER_CLASSES,
    SAMPLER_CLASSES,
    Binding,
    argument_of,
    string_key,
    string_value,
)
from lintdist.loop import is_accumulation_name
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Rule, Valid

# Scheduler constructors with a total length: qualified name -> ((parameter, position) of the length, of the warmup).
_TRANSFORMERS_WARMUP = (("num_training_steps", 2), ("num_warmup_steps", 1))
_SCHEDULE_FUNCTIONS = (
    "get_linear_schedule_with_warmup",
    "get_cosine_schedule_with_warmup",
    "get_cosine_with_hard_restarts_schedule_with_warmup",
    "get_polynomial_decay_schedule_with_warmup",
    "get_cosine_with_min_lr_schedule_with_warmup",
    "get_cosine_with_min_lr_schedule_with_warmup_lr_rate",
)
LENGTHS: dict[str, tuple[tuple[str, int], tuple[str, int] | None]] = {
    # transformers.get_scheduler(name, optimizer, num_warmup_steps, num_training_steps, ...)
    "transformers.get_scheduler": (("num_training_steps", 3), ("num_warmup_steps", 2)),
    "transformers.optimization.get_scheduler": (("num_training_steps", 3), ("num_warmup_steps", 2)),
    # diffusers.optimization.get_scheduler(name, optimizer, step_rules, num_warmup_steps, num_training_steps, ...)
    "diffusers.optimization.get_scheduler": (("num_training_steps", 4), ("num_warmup_steps", 3)),
    "diffusers.get_scheduler": (("num_training_steps", 4), ("num_warmup_steps", 3)),
    **{
        f"{package}.{name}": _TRANSFORMERS_WARMUP
        for package in ("transformers", "transformers.optimization", "diffusers.optimization")
        for name in _SCHEDULE_FUNCTIONS
    },
    "torch.optim.lr_scheduler.LinearLR": (("total_iters", 3), None),
    "torch.optim.lr_scheduler.ConstantLR": (("total_iters", 2), None),
    "torch.optim.lr_scheduler.PolynomialLR": (("total_iters", 1), None),
    "torch.optim.lr_scheduler.CosineAnnealingLR": (("T_max", 1), None),
    "torch.optim.lr_scheduler.OneCycleLR": (("total_steps", 2), None),
}
ONE_CYCLE = "torch.optim.lr_scheduler.OneCycleLR"
LAMBDA_SCHEDULERS = frozenset({"torch.optim.lr_scheduler.LambdaLR"})
SCHEDULER_CLASSES = frozenset(LENGTHS) | LAMBDA_SCHEDULERS
# `get_scheduler` names whose schedule has no total length (the length is ignored).
NO_LENGTH = frozenset(
    {"constant", "constant_with_warmup", "inverse_sqrt", "reduce_lr_on_plateau", "piecewise_constant"}
)
TOTAL_STEPS = frozenset({"lintdist.runtime.scheduler_total_steps", "lintdist.runtime.loop.scheduler_total_steps"})
PASS_THROUGH = frozenset({"int", "float", "round", "abs", "math.ceil", "math.floor", "math.trunc"})
# A count of data-parallel processes: `accelerator.num_processes`, `dist.get_world_size()`, `args.world_size`...
WORLD = re.compile(
    r"(?:num_processes|world_size|num_replicas|n_?gpus?|num_gpus|num_devices|nprocs?|nproc_per_node|dp_size"
    r"|data_parallel_size|dp_world_size)$",
    re.IGNORECASE,
)
MAX_DEPTH = 8
MAX_PATHS = 16


@dataclass(frozen=True)
class Value:
    """One way a length expression may evaluate: whether it is a count of steps, the power of W (the number of
    processes) it carries relative to a count of optimizer steps, and why it is a count."""

    count: bool = False
    world: int = 0
    unknown: bool = False
    why: str = ""
    # the loop test that makes a name a count of optimizer steps (its line is put in words only for a message)
    where: cst.CSTNode | None = field(default=None, compare=False)


NEUTRAL = Value()
UNKNOWN = Value(unknown=True)
WORLD_FACTOR = Value(world=1)


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

    # -- entry ---------------------------------------------------------------------------------

    def finish(self) -> None:
        self._scheduler_names: set[str] = set()
        self._loops: dict[frozenset[str], list] = {}
        self._bounds: dict[tuple[str, frozenset[str]], cst.CSTNode | None] = {}
        self._assigned_from: dict[str, set[str]] | None = None
        self._bounds_of_loop: dict[int, list] = {}
        if self.loop.surely_single:
            return
        seen: set[int] = set()
        for prepare, argument, target in self._prepared_arguments():
            for origin in self.facts.origins(argument, prepare):
                call = origin.node
                if not isinstance(call, cst.Call) or origin.index is not None or id(call) in seen:
                    continue
                qualified = self._scheduler_name(call)
                if qualified is None:
                    continue
                seen.add(id(call))
                if self._one_step_per_optimizer_step(prepare):
                    continue
                names = {n for n in (get_full_name_for_node(argument), target) if n}
                self._check(call, qualified, prepare, names)

    # -- which schedulers are prepared ----------------------------------------------------------

    def _prepared_arguments(self):
        """(prepare call, argument, name the prepared value is bound to) for ``accelerator.prepare(...)`` and
        ``accelerator.prepare_scheduler(...)``."""
        facts = self.facts
        for call in facts.calls:
            func = call.func
            if not isinstance(func, cst.Attribute) or func.attr.value not in {"prepare", "prepare_scheduler"}:
                continue
            if not facts.accelerator_like(func.value, call):
                continue
            targets = _assigned_targets(facts, call)
            positional = [arg for arg in call.args if arg.keyword is None]
            if any(arg.star for arg in positional):
                continue
            for index, arg in enumerate(positional):
                target = None
                if targets is not None and len(targets) == len(positional):
                    target = get_full_name_for_node(targets[index])
                yield call, arg.value, target

    def _scheduler_name(self, call: cst.Call) -> str | None:
        names = self.facts.qualified_names(call.func)
        found = [n for n in names if n in SCHEDULER_CLASSES]
        return found[0] if found else None

    def _one_step_per_optimizer_step(self, prepare: cst.Call) -> bool:
        """The Accelerator that prepares the scheduler steps it once per optimizer step, or may: a
        ``step_scheduler_with_optimizer`` that is not literally True, or a ``DataLoaderConfiguration`` whose
        ``split_batches`` is not literally False; an Accelerator built with ``**kwargs`` lintdist cannot read."""
        facts = self.facts
        receiver = prepare.func.value
        for origin in facts.origins(receiver, prepare):
            accelerator = origin.node
            if not isinstance(accelerator, cst.Call) or not facts.callee_is(accelerator, ACCELERATOR_CLASSES):
                continue
            if facts.stand_in_note(accelerator):
                continue  # made in another module: its keywords are not in sight
            if any(arg.star == "**" and self._may_set_stepping(arg.value, accelerator) for arg in accelerator.args):
                return True
            if any(arg.star == "*" for arg in accelerator.args):
                return True
            step = argument_of(accelerator, "step_scheduler_with_optimizer", None)
            if step is not None and not _is_literal(step, "True"):
                return True
            config = argument_of(accelerator, "dataloader_config", None)
            if config is not None and self._splits_batches(config, accelerator):
                return True
        return False

    def _may_set_stepping(self, kwargs: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """``Accelerator(**kwargs)``: unless ``kwargs`` is a dict of this file whose keys are all known (its
        literal keys and ``kwargs["key"] = ...`` assignments, as the ``no_trainer`` examples build their logging
        keywords), one of them may set the scheduler's stepping."""
        facts = self.facts
        key = get_full_name_for_node(kwargs)
        # the dict's own assignments (`kwargs[...] = v` is bound under the dict's name too: its keys are read below)
        bindings = [b for b in facts.bindings(key, at) if not _subscript_target(b)] if key else []
        if not bindings:
            return True
        keys: set[str | None] = set()
        for binding in bindings:
            for origin in facts.origins(binding.value, binding.statement):
                node = origin.node
                if isinstance(node, cst.Dict):
                    keys |= {string_value(e.key) if isinstance(e, cst.DictElement) else None for e in node.elements}
                elif not (isinstance(node, cst.Call) and get_full_name_for_node(node.func) == "dict" and not node.args):
                    return True
        for name in facts.within(facts.enclosing_function(at) or self.context.module, cst.Name, cst.Attribute):
            if get_full_name_for_node(name) != key:
                continue
            parent = facts.parent(name)
            if isinstance(parent, cst.Subscript) and parent.value is name:
                keys.add(string_key(parent))
            elif (
                isinstance(parent, cst.Attribute)
                and parent.value is name
                and parent.attr.value not in {"get", "items", "keys"}
            ):
                return True  # `kwargs.update(...)`, `kwargs.setdefault(...)`
        return bool(keys & {None, "step_scheduler_with_optimizer", "dataloader_config", "split_batches"})

    def _ignored_split_batches(self) -> cst.CSTNode | None:
        """``Accelerator(split_batches=...)``: a keyword accelerate 1.x accepts and never reads."""
        facts = self.facts
        for origin in facts.origins(self._prepare.func.value, self._prepare):
            accelerator = origin.node
            if isinstance(accelerator, cst.Call) and facts.callee_is(accelerator, ACCELERATOR_CLASSES):
                for arg in accelerator.args:
                    if arg.keyword is not None and arg.keyword.value == "split_batches":
                        return arg
        return None

    def _splits_batches(self, config: cst.BaseExpression, at: cst.CSTNode) -> bool:
        for origin in self.facts.origins(config, at):
            node = origin.node
            if not isinstance(node, cst.Call):
                return True  # a configuration lintdist cannot read
            if any(arg.star for arg in node.args):
                return True
            split = argument_of(node, "split_batches", 0)
            if split is not None and not _is_literal(split, "False"):
                return True
        return False

    # -- the length ------------------------------------------------------------------------------

    def _check(self, call: cst.Call, qualified: str, prepare: cst.Call, names: set[str]) -> None:
        self._scheduler_names = names
        self._prepare = prepare
        if qualified in LAMBDA_SCHEDULERS:
            self._check_lambda(call, prepare)
            return
        if qualified.endswith("get_scheduler"):
            kind = argument_of(call, "name", 0)
            if string_value(kind) in NO_LENGTH:
                return
        (length_name, length_position), warmup_spec = LENGTHS[qualified]
        length = argument_of(call, length_name, length_position)
        if length is None and qualified == ONE_CYCLE:
            length_name, length = "steps_per_epoch", argument_of(call, "steps_per_epoch", 4)
        if length is None:
            return
        values = self._evaluate(length, call, 0)
        bad = [v for v in values if v.count and not v.unknown and v.world <= 0]
        if not bad:
            return
        mixed = not all(v.count and not v.unknown and v.world <= 0 for v in values)
        # a length a helper receives: its other callers would be changed too; the call site is the place
        fixable = not self._parameter_read(length, call)
        replacements = []
        accelerator = self.loop.accelerator_at(prepare, call) if fixable else None
        if accelerator is not None and self.context.runtime_name_free("scheduler_total_steps"):
            replacements = (
                self._two_branch_fix(length, call, accelerator) if mixed else [(length, _wrapped(length, accelerator))]
            )
        if replacements and warmup_spec is not None:  # a warmup in optimizer steps is short by the same factor
            warmup = argument_of(call, *warmup_spec)
            if warmup is not None and self._unscaled_warmup(warmup, call):
                replacements.append((warmup, _wrapped(warmup, accelerator)))
        self._report(length, f"`{length_name}`", bad[0], mixed, replacements)

    def _two_branch_fix(self, length: cst.BaseExpression, call: cst.Call, accelerator: str) -> list:
        """The given-or-derived length (``if args.max_train_steps is None: args.max_train_steps = <from the
        un-sharded loader>``): only the given count needs the factor. Both branches set the scheduler's own length
        (the derived count as it is, the given one through ``scheduler_total_steps``), and the scheduler reads it,
        as the diffusers scripts do since their PR #8312. Empty when the shape is another."""
        facts = self.facts
        key = get_full_name_for_node(length) if isinstance(length, (cst.Name, cst.Attribute)) else None
        if key is None:
            return []
        bindings, falls_through = self._reaching(key, call)
        if not falls_through or len(bindings) != 1:
            return []
        (binding,) = bindings
        line = facts.parent(binding.statement)
        branch = facts.parent(facts.parent(line))
        if (
            not isinstance(line, cst.SimpleStatementLine)
            or not isinstance(branch, cst.If)
            or branch.orelse is not None
            or not _derives_when_missing(branch.test, key)
            or facts.enclosing_function(branch) is not facts.enclosing_function(call)
            or any(v.unknown or (v.count and v.world <= 0) for v in self._evaluate(binding.value, binding.statement, 1))
        ):
            return []
        own = re.sub(r"\W", "_", key.rsplit(".", 1)[-1]) + "_for_scheduler"
        if re.search(rf"\b{own}\b", self.context.text) or self.loop.accelerator_at(self._prepare, branch) != accelerator:
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
        a function of this file)."""
        facts = self.facts
        function = argument_of(call, "lr_lambda", 1)
        if function is None:
            return
        definition = self._lambda_definition(function, call)
        if definition is None:
            return
        parameters = _parameter_names(definition.params)
        local = _assigned_names(facts, definition)
        reads: dict[str, list[cst.Name]] = {}
        body = definition.body
        for name in facts.within(body, cst.Name):
            if not facts.is_variable(name):
                continue
            parent = facts.parent(name)
            if name.value in parameters or name.value in local or name.value in facts.imported_names:
                continue
            if isinstance(parent, cst.Call) and parent.func is name:
                continue
            if self._scaled_where_read(name, call):
                reads[name.value] = []  # one read already scaled: the name is handled
                continue
            if reads.get(name.value) != []:
                reads.setdefault(name.value, []).append(name)
        at = call if facts.enclosing_function(definition) is facts.enclosing_function(call) else definition
        for key, nodes in reads.items():
            if not nodes:
                continue
            values = self._evaluate(nodes[0], at, 0)
            bad = [v for v in values if v.count and not v.unknown and v.world <= 0]
            if not bad:
                continue
            mixed = not all(v.count and not v.unknown and v.world <= 0 for v in values)
            replacements = []
            accelerator = self.loop.accelerator_at(prepare, definition) if not mixed else None
            if accelerator is not None and self.context.runtime_name_free("scheduler_total_steps"):
                replacements = [(node, _wrapped(node, accelerator)) for node in nodes]
            self._report(call, f"the step count `{key}` that its `lr_lambda` reads", bad[0], mixed, replacements)
            return

    def _scaled_where_read(self, name: cst.Name, at: cst.CSTNode) -> bool:
        """The lambda reads ``name`` through ``scheduler_total_steps(name, ...)`` or times the number of processes
        (``total * accelerator.num_processes``)."""
        facts = self.facts
        parent = facts.parent(name)
        if isinstance(parent, cst.Arg):
            call = facts.parent(parent)
            return isinstance(call, cst.Call) and bool(facts.qualified_names(call.func) & TOTAL_STEPS)
        if isinstance(parent, cst.BinaryOperation) and isinstance(parent.operator, cst.Multiply):
            other = parent.right if parent.left is name else parent.left
            return any(v.world >= 1 for v in self._evaluate(other, at, 0))
        return False

    def _lambda_definition(self, function: cst.BaseExpression, at: cst.CSTNode):
        if isinstance(function, cst.Lambda):
            return function
        if isinstance(function, cst.Name):
            for origin in self.facts.origins(function, at):
                if isinstance(origin.node, cst.Lambda):
                    return origin.node
            defined = [
                f
                for f in self.facts.functions.get(function.value, ())
                if self.facts.enclosing_class(f) is None and self.facts.index.order(f) < self.facts.index.order(at)
            ]
            if defined:
                return defined[-1]
        return None

    def _unscaled_warmup(self, warmup: cst.BaseExpression, at: cst.CSTNode) -> bool:
        if isinstance(warmup, cst.Integer) and warmup.evaluated_value == 0:
            return False
        values = self._evaluate(warmup, at, 0)
        return bool(values) and all(not v.unknown and v.world <= 0 for v in values)

    def _report(self, where: cst.CSTNode, what: str, value: Value, mixed: bool, replacements) -> None:
        why = value.why
        if value.where is not None:
            why += f" at line {self.context.span(value.where).line}"
        processes = self.context.settings.get("num_processes") if self.context.settings else None
        count = str(processes.value).strip() if processes is not None else ""
        # A count multiplied by the accumulation steps is k times too long as well: the schedule then ends after
        # k/W of training, and not at all when k >= W (accelerate steps it only on the optimizer step).
        accumulated = isinstance(where, cst.BaseExpression) and any(
            isinstance(op, cst.BinaryOperation)
            and isinstance(op.operator, cst.Multiply)
            and (is_accumulation_name(op.left) or is_accumulation_name(op.right))
            for op in self.facts.within(where, cst.BinaryOperation)
        )
        if accumulated:
            world = count if count.isdigit() else "`num_processes`"
            effect = (
                "`accelerator.prepare` wraps the scheduler so that it steps `num_processes` times per optimizer step "
                "and not at all while gradients accumulate: the schedule ends after `gradient_accumulation_steps`/"
                f"{world} of training, and does not finish when the accumulation is at least the number of processes"
            )
            message = (
                f"{what} counts optimizer steps times `gradient_accumulation_steps` ({why}), but {effect}; drop the "
                "accumulation factor and multiply the optimizer steps by the number of processes "
                "(`scheduler_total_steps(n, accelerator)`)"
            )
            if mixed:  # the count derived from the un-sharded loader needs no factor: the product is k times long
                message = (
                    f"{what} is a step budget times `gradient_accumulation_steps` ({why}), but `accelerator.prepare` "
                    "wraps the scheduler so that it steps `num_processes` times per optimizer step and not at all "
                    "while gradients accumulate: with a given budget the schedule ends after "
                    f"`gradient_accumulation_steps`/{world} of training (or never finishes, when the accumulation is "
                    "at least the number of processes), and with a budget derived from the un-sharded loader before "
                    "`prepare` it gets only 1/`gradient_accumulation_steps` of the way; drop the accumulation "
                    "factor, and multiply a given budget by the number of processes "
                    "(`scheduler_total_steps(n, accelerator)`)"
                )
            replacements = []  # wrapping the product would keep the accumulation factor: no fix
        else:
            ends = (
                f"1/{count} of training (the launch runs {count} processes)"
                if count.isdigit()
                else "1/`num_processes` of training (halfway with 2 processes)"
            )
            effect = (
                "`accelerator.prepare` wraps the scheduler so that it steps `num_processes` times per optimizer step, "
                f"and the schedule ends after {ends}"
            )
            if not mixed:
                message = (
                    f"{what} counts optimizer steps ({why}), but {effect}; multiply it by the number of processes "
                    "(`scheduler_total_steps(n, accelerator)`)"
                )
            else:
                message = (
                    f"{what} counts optimizer steps when the count is given rather than derived ({why}), but "
                    f"{effect}; multiply the given count by `accelerator.num_processes` (a count derived from the "
                    "loader before `prepare` counts un-sharded batches and needs no factor)"
                )
        ignored = self._ignored_split_batches()
        if ignored is not None:
            message += (
                f"; `split_batches=` given to `Accelerator(...)` at line {self.context.span(ignored).line} is ignored "
                "by accelerate 1.x (accelerate #3177): only `DataLoaderConfiguration(split_batches=True)` is read"
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
                imports=(("lintdist.runtime", "scheduler_total_steps"),),
            )
        self.report(where, message, fix=fix)

    # -- what a length expression counts -------------------------------------------------------------

    def _evaluate(self, expr: cst.BaseExpression, at: cst.CSTNode, depth: int) -> list[Value]:
        """The ways ``expr`` (at ``at``) may evaluate, as ``Value``s (at most MAX_PATHS)."""
        if depth > MAX_DEPTH:
            return [UNKNOWN]
        if isinstance(expr, (cst.Integer, cst.Float)):
            return [NEUTRAL]
        if isinstance(expr, (cst.Name, cst.Attribute)):
            return self._evaluate_name(expr, at, depth)
        if isinstance(expr, cst.Subscript):
            if _world_subscript(expr):
                return [WORLD_FACTOR]
            return [NEUTRAL]
        if isinstance(expr, cst.UnaryOperation):
            return self._evaluate(expr.expression, at, depth + 1)
        if isinstance(expr, cst.IfExp):
            return _cap(self._evaluate(expr.body, at, depth + 1) + self._evaluate(expr.orelse, at, depth + 1))
        if isinstance(expr, cst.BinaryOperation):
            left = self._evaluate(expr.left, at, depth + 1)
            right = self._evaluate(expr.right, at, depth + 1)
            return _cap([_combine(expr.operator, a, b) for a in left for b in right])
        if isinstance(expr, cst.Call):
            return self._evaluate_call(expr, at, depth)
        return [UNKNOWN]

    def _evaluate_call(self, call: cst.Call, at: cst.CSTNode, depth: int) -> list[Value]:
        facts = self.facts
        func = call.func
        method = facts.method_name(call) or ""
        positional = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
        if isinstance(func, cst.Name) and func.value == "len" and len(positional) == 1:
            return [self._loader_length(positional[0], at)]
        if WORLD.search(method):
            return [WORLD_FACTOR]
        names = facts.qualified_names(func)
        if names & TOTAL_STEPS and positional:
            return [replace(v, world=v.world + 1) for v in self._evaluate(positional[0], at, depth + 1)]
        simple = get_full_name_for_node(func) or ""
        if (names & PASS_THROUGH or simple in PASS_THROUGH) and positional:
            return self._evaluate(positional[0], at, depth + 1)
        if simple in {"max", "min"} and positional:
            return _cap([v for arg in positional for v in self._evaluate(arg, at, depth + 1)])
        return [UNKNOWN]

    def _evaluate_name(self, expr: cst.BaseExpression, at: cst.CSTNode, depth: int) -> list[Value]:
        key = get_full_name_for_node(expr)
        last = expr.attr.value if isinstance(expr, cst.Attribute) else expr.value
        if WORLD.search(last):
            return [WORLD_FACTOR]
        if key is None:
            return [NEUTRAL]
        bindings, falls_through = self._reaching(key, at)
        values: list[Value] = []
        if falls_through or not bindings:
            # the value from before (a parsed option, an argument, a config field): a count of optimizer steps
            # when the training loop stops on it; a parameter: what the calls of this file pass
            passed = self._passed(expr, at, depth) if isinstance(expr, cst.Name) else []
            values.extend(passed or [self._leaf(key)])
        for binding in bindings:
            if binding.index is not None:
                values.append(UNKNOWN)
                continue
            values.extend(self._evaluate(binding.value, binding.statement, depth + 1))
        values = _cap(values)
        if values and not any(v.count or v.unknown for v in values):
            # assigned a constant (`max_steps = 1000`) or an option that the training loop stops on
            values = [self._leaf(key)]
        return values

    def _parameter_read(self, expr: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """``expr`` reads a parameter of a function that this file calls with the length (a helper)."""
        facts = self.facts
        for name in facts.within(expr, cst.Name):
            if isinstance(facts.parent(name), cst.Attribute) or name.value in {"self", "cls"}:
                continue
            found = facts.parameter(name.value, at)
            if found is not None and not facts.bindings(name.value, at) and facts.call_sites(found[0]):
                return True
        return False

    def _passed(self, name: cst.Name, at: cst.CSTNode, depth: int) -> list[Value]:
        """What the calls of this file pass for the parameter ``name`` (a helper that builds the scheduler)."""
        facts = self.facts
        found = facts.parameter(name.value, at)
        if found is None:
            return []
        function, index, _ = found
        values: list[Value] = []
        for call in facts.call_sites(function):
            argument = facts.argument_for(call, function, name.value, index)
            values.extend(self._evaluate(argument, call, depth + 1) if argument is not None else [NEUTRAL])
        return _cap(values)

    def _leaf(self, key: str) -> Value:
        bound = self._bounds_training_loop(key)
        if bound is None:
            return NEUTRAL
        return Value(count=True, why=f"`{key}` bounds the training loop", where=bound)

    def _reaching(self, key: str, at: cst.CSTNode) -> tuple[list[Binding], bool]:
        """The assignments to ``key`` that may give its value at ``at``, and whether its value from before them
        (an argument, a parsed option) may reach ``at`` too: the last assignment before ``at`` in the same
        function, and the ones before it while it is conditional (inside an ``if`` or a loop that ``at`` is not)."""
        facts = self.facts
        order = facts.index.order
        function = facts.enclosing_function(at)
        found = facts.bindings(key, at)
        same = [b for b in found if b.function is function]
        if not same:
            return found, False
        before = sorted((b for b in same if 0 <= order(b.statement) < order(at)), key=lambda b: -order(b.statement))
        if not before:
            # assigned only later (or in other methods of the class): an attribute set elsewhere
            others = [b for b in found if b.function is not function]
            return others, not others
        chosen: list[Binding] = []
        for binding in before:
            if facts.exclusive(binding.statement, at):
                continue
            chosen.append(binding)
            if not self._conditional(binding.statement, at):
                return chosen, False
        return chosen, True

    def _conditional(self, statement: cst.CSTNode, at: cst.CSTNode) -> bool:
        facts = self.facts
        for ancestor in facts.ancestors(statement):
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda, cst.ClassDef, cst.Module)):
                return False
            if isinstance(ancestor, (cst.If, cst.For, cst.While, cst.ExceptHandler)) and not facts.is_within(
                at, ancestor
            ):
                return True
        return False

    def _loader_length(self, loader: cst.BaseExpression, at: cst.CSTNode) -> Value:
        """``len(loader)``: a count of each rank's batches (a prepared loader, or one with a ``DistributedSampler``:
        W power 0), of all batches (a ``DataLoader`` before ``prepare``: W power 1), or unknown."""
        facts = self.facts
        name = get_full_name_for_node(loader) or "the loader"
        values = {
            "prepared": Value(count=True, why=f"the length of the prepared loader `{name}`"),
            "sharded": Value(count=True, why=f"the length of `{name}`, which a `DistributedSampler` shards"),
            "unsharded": Value(count=True, world=1),
        }
        key = get_full_name_for_node(loader) if isinstance(loader, (cst.Name, cst.Attribute)) else None
        kinds: set[str] = set()
        function = facts.enclosing_function(at)
        if key and any(b.function is function for b in facts.bindings(key, at)):
            # assigned in this function: what the last assignments before `at` made (nothing yet: unknown)
            bindings, falls_through = self._reaching(key, at)
            if falls_through or not bindings:
                return UNKNOWN
            for binding in bindings:
                if binding.index is not None:
                    prepared = isinstance(binding.value, cst.Call) and facts.is_prepare_call(binding.value)
                    kinds.add("prepared" if prepared else "unknown")
                else:
                    kinds |= {self._loader_kind(o.node) for o in facts.origins(binding.value, binding.statement)}
        else:
            kinds = {self._loader_kind(o.node) for o in facts.origins(loader, at)}
        return values.get(kinds.pop(), UNKNOWN) if len(kinds) == 1 else UNKNOWN

    def _loader_kind(self, node: cst.CSTNode) -> str:
        facts = self.facts
        if not isinstance(node, cst.Call):
            return "unknown"
        if facts.is_prepare_call(node):
            return "prepared"
        if not facts.is_instance_of(node, DATALOADER_CLASSES, "DataLoader"):
            return "unknown"
        is_dataloader = facts.is_instance_of(node, DATALOADER_CLASSES)
        for keyword, position in (("sampler", 3), ("batch_sampler", 4)):
            argument = argument_of(node, keyword, position if is_dataloader else None)
            if argument is None:
                continue
            for origin in facts.origins(argument, node):
                sampler = origin.node
                if isinstance(sampler, cst.Call):
                    inner = argument_of(sampler, "sampler", 0)
                    samplers = (
                        [sampler] + [o.node for o in facts.origins(inner, sampler)] if inner is not None else [sampler]
                    )
                    if any(
                        isinstance(s, cst.Call) and facts.is_instance_of(s, SAMPLER_CLASSES, "DistributedSampler")
                        for s in samplers
                    ):
                        return "sharded"
        return "unsharded"

    # -- does a name bound the training loop ---------------------------------------------------------

    def _bounds_training_loop(self, key: str) -> cst.CSTNode | None:
        """The line of a loop test or ``range`` bound, or of an ``if ...: break`` inside a loop, that compares
        the steps taken with ``key`` (or a name assigned from it), in a loop that steps the scheduler."""
        memo = (key, frozenset(self._scheduler_names))
        if memo not in self._bounds:
            self._bounds[memo] = self._find_bound(key)
        return self._bounds[memo]

    def _find_bound(self, key: str) -> cst.CSTNode | None:
        facts = self.facts
        if self._assigned_from is None:  # `b = a` targets by the name of `a`, read once per file
            self._assigned_from = {}
            for assign in facts.index.nodes(cst.Assign):
                source = get_full_name_for_node(assign.value)
                if source is not None:
                    targets = {get_full_name_for_node(t.target) for t in assign.targets} - {None}
                    self._assigned_from.setdefault(source, set()).update(targets)
        aliases = {key} | self._assigned_from.get(key, set())
        for loop in self._stepping_loops():
            for names, bound in self._loop_bounds(loop):
                if names & aliases:
                    return bound
        return None

    def _loop_bounds(self, loop: cst.For | cst.While) -> list[tuple[set[str], cst.CSTNode]]:
        """What can bound a loop, in order, each with the names it mentions: a ``range(...)`` in a ``for``'s
        iterable (``range(n)``, ``tqdm(range(n))``), a ``while`` test's comparisons, and the comparisons of
        each ``if ...: break``/``return`` in the body. Read once per loop."""
        if id(loop) in self._bounds_of_loop:
            return self._bounds_of_loop[id(loop)]
        facts = self.facts
        found: list[tuple[set[str], cst.CSTNode]] = []
        if isinstance(loop, cst.For):
            ranges = [c for c in facts.within(loop.iter, cst.Call) if get_full_name_for_node(c.func) == "range"]
            found += [(_names(facts, call), loop) for call in ranges]
        else:
            found += [(_names(facts, c), loop) for c in facts.within(loop.test, cst.Comparison)]
        for test in facts.within(loop.body, cst.If):
            if facts.within(test.body, cst.Break, cst.Return):
                found += [(_names(facts, c), test) for c in facts.within(test.test, cst.Comparison)]
        self._bounds_of_loop[id(loop)] = found
        return found

    def _stepping_loops(self) -> list:
        """The loops around the scheduler's ``step()`` calls, also around the calls of the function holding them."""
        names = frozenset(self._scheduler_names)
        if names in self._loops:
            return self._loops[names]
        facts = self.facts
        steps = [c for c in facts.calls if facts.method_name(c) == "step" and self._is_scheduler_receiver(c)]
        if not steps:
            steps = [
                c
                for c in facts.calls
                if facts.method_name(c) == "step"
                and isinstance(c.func, cst.Attribute)
                and "sched" in (get_full_name_for_node(c.func.value) or "").lower()
            ]
        loops: list = []
        pending = list(steps)
        seen: set[int] = set()
        for _ in range(3):
            following = []
            for node in pending:
                for ancestor in facts.ancestors(node):
                    if isinstance(ancestor, (cst.For, cst.While)) and id(ancestor) not in seen:
                        seen.add(id(ancestor))
                        loops.append(ancestor)
                    if isinstance(ancestor, cst.FunctionDef):
                        following.extend(facts.call_sites(ancestor))
                        break
            pending = following
        self._loops[names] = loops
        return loops

    def _is_scheduler_receiver(self, call: cst.Call) -> bool:
        return isinstance(call.func, cst.Attribute) and get_full_name_for_node(call.func.value) in self._scheduler_names


# -- helpers -------------------------------------------------------------------------------------------


def _combine(operator: cst.BaseBinaryOp, a: Value, b: Value) -> Value:
    if a.unknown or b.unknown:
        return UNKNOWN
    # the reason to show: a loader's length before a loop bound (`epochs * len(loader)` counts the loader)
    source = a if (a.why and (a.where is None or not b.why or b.where is not None)) or not b.why else b
    if isinstance(operator, cst.Multiply):
        return Value(count=a.count or b.count, world=a.world + b.world, why=source.why, where=source.where)
    if isinstance(operator, (cst.Divide, cst.FloorDivide)):
        return Value(count=a.count, world=a.world - b.world, why=a.why, where=a.where)
    if isinstance(operator, (cst.Add, cst.Subtract)):
        if a.count and b.count:
            return a if a.world == b.world else UNKNOWN
        if a.count or b.count:
            return a if a.count else b
        return Value(world=max(a.world, b.world))
    return UNKNOWN


def _cap(values: list[Value]) -> list[Value]:
    unique = list(dict.fromkeys(values))
    return unique if len(unique) <= MAX_PATHS else [UNKNOWN]


def _subscript_target(binding: Binding) -> bool:
    statement = binding.statement
    targets = [t.target for t in statement.targets] if isinstance(statement, cst.Assign) else [statement.target]
    return any(isinstance(t, cst.Subscript) for t in targets)


def _is_literal(expr: cst.BaseExpression, value: str) -> bool:
    return isinstance(expr, cst.Name) and expr.value == value


def _world_subscript(expr: cst.Subscript) -> bool:
    """``os.environ["WORLD_SIZE"]``."""
    if len(expr.slice) != 1 or not isinstance(expr.slice[0].slice, cst.Index):
        return False
    return string_value(expr.slice[0].slice.value) == "WORLD_SIZE"


def _derives_when_missing(test: cst.BaseExpression, key: str) -> bool:
    """The test of the branch that derives ``key`` when none was given: ``key is None`` or ``not key``."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return get_full_name_for_node(test.expression) == key
    return (
        isinstance(test, cst.Comparison)
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, cst.Is)
        and get_full_name_for_node(test.comparisons[0].comparator) == "None"
        and get_full_name_for_node(test.left) == key
    )


def _wrapped(expr: cst.BaseExpression, accelerator: str) -> cst.Call:
    return cst.Call(
        func=cst.Name("scheduler_total_steps"),
        args=(
            cst.Arg(expr.with_changes(lpar=(), rpar=()) if _bare_parentheses(expr) else expr),
            cst.Arg(cst.parse_expression(accelerator)),
        ),
    )


def _bare_parentheses(expr: cst.BaseExpression) -> bool:
    return bool(getattr(expr, "lpar", ())) and not isinstance(expr, cst.Tuple)


def _assigned_targets(facts, call: cst.Call) -> list[cst.BaseExpression] | None:
    """The names a call's result is unpacked into (``a, b = call``), or ``[x]`` for ``x = call``."""
    parent = facts.parent(call)
    if not isinstance(parent, cst.Assign) or parent.value is not call or len(parent.targets) != 1:
        return None
    target = parent.targets[0].target
    if isinstance(target, (cst.Tuple, cst.List)):
        return [element.value for element in target.elements]
    return [target]


def _parameter_names(params: cst.Parameters) -> set[str]:
    every = [*params.posonly_params, *params.params, *params.kwonly_params]
    every += [p for p in (params.star_arg, params.star_kwarg) if isinstance(p, cst.Param)]
    return {p.name.value for p in every}


def _assigned_names(facts, definition: cst.CSTNode) -> set[str]:
    names = set()
    for statement in facts.within(definition, cst.Assign, cst.AugAssign, cst.AnnAssign):
        targets = [t.target for t in statement.targets] if isinstance(statement, cst.Assign) else [statement.target]
        for target in targets:
            names |= {n.value for n in facts.within(target, cst.Name)}
    for loop in facts.within(definition, cst.For):
        names |= {n.value for n in facts.within(loop.target, cst.Name)}
    return names


def _names(facts, expr: cst.CSTNode) -> set[str]:
    """The full names of the names and attributes in ``expr`` (``args.max_train_steps``, ``step``)."""
    return {name for node in facts.within(expr, cst.Name, cst.Attribute) if (name := get_full_name_for_node(node))}
