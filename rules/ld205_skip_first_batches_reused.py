"""LD205 skip-first-batches-reused: the loader from `skip_first_batches` iterated again in later epochs."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.accelerators import accelerator_receiver
from lintdist.facts import Loop, argument_of
from lintdist.invariance import (
    ancestors_inside,
    assigned_keys,
    range_start,
    rebound_between,
    rebound_in,
    same_each_pass,
)
from lintdist.joint_edits import block_statement, joint_replacement
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Rule, Valid
from lintdist.spelling import unused_name
from lintdist.values import constant_truth

SKIP_FUNCTIONS = frozenset({"accelerate.skip_first_batches", "accelerate.data_loader.skip_first_batches"})
ACTIVE = "active_dataloader"


@dataclass(frozen=True)
class Reuse:
    """A skipping loader that a later epoch of ``epoch_loop`` iterates again."""

    skip: cst.Call  # the skip_first_batches(...) call
    kind: str  # "before" | "stale" | "rebind" | "every"
    epoch_loop: Loop
    loader_there: cst.BaseExpression  # the loader at the epoch loop (the data loop's, or a helper's argument)
    target: str | None  # the name the skipping loader is bound to; None when iterated in place


class SkipFirstBatchesReused(Rule):
    """
    ## What it does
    Reports a loader made by `accelerator.skip_first_batches(loader, n)` (or
    `accelerate.skip_first_batches`) that an epoch loop iterates in more than
    the resumed epoch: the call's result bound before the epoch loop, or
    rebound over the loader's own name (`loader = skip_first_batches(loader,
    n)`), or bound under an `if` and never reset in the epoch loop, or built
    afresh every epoch with the same `n`, also under a guard that stays true
    after the resumed epoch (`if resume_step is not None:` with `resume_step`
    never cleared and no test of the epoch). The report points at the
    `skip_first_batches` call.

    ## Why is this bad?
    `skip_first_batches` returns a new loader whose batch sampler is a
    `SkipBatchSampler`: it drops the first `n` batches on **every** pass, not
    just the first one. Iterated again in the next epochs, it silently trains
    on `n` fewer batches each epoch (and rebinding it over the loader's own
    name loses the full loader for the rest of the run). The intended use is
    to iterate it for the resumed epoch only and then go back to the original
    loader. Not reported: the `active_dataloader = ...` pattern of accelerate's
    examples (set to the original loader in the other branch, every epoch), a
    helper whose parameter is rebound for one epoch's call only, an `n` that
    changes inside the epoch loop, and a skip under a condition that changes
    with the epoch (`epoch == starting_epoch`, a step the loop clears).

    ## Example
    ```python
    if resume_step:
        train_dataloader = accelerator.skip_first_batches(train_dataloader, resume_step)
    for epoch in range(starting_epoch, num_epochs):
        for batch in train_dataloader:
            ...
    ```

    ## Use instead
    ```python
    for epoch in range(starting_epoch, num_epochs):
        if resume_step and epoch == starting_epoch:
            active_dataloader = accelerator.skip_first_batches(train_dataloader, resume_step)
        else:
            active_dataloader = train_dataloader
        for batch in active_dataloader:
            ...
    ```

    ## Fix safety
    Unsafe: it changes which batches later epochs train on (that is the point,
    but `len()` of the loader changes for them too, and so does anything
    derived from it). When the skip rebinds the loader's own name, the fix
    binds it to `active_dataloader` instead and iterates that; the name that
    holds the skipping loader is then set back to the full loader for the
    epochs after the resumed one (at the start of each epoch when the skip
    is gated inside the epoch loop, after the loader's use when it comes
    before the loop). A skip made afresh every epoch becomes
    `skip_first_batches(loader, n) if epoch == <first epoch> else loader` in a
    `for epoch in range(...)` loop. No fix when the name `active_dataloader`
    is taken in that function, when the loader is not a plain name or is
    rebound in the epoch loop, when the skip and the loop are in different
    functions (an attribute set by a `resume()` method), or for other loop
    shapes.

    ## References
    - accelerate `accelerate/data_loader.py`, `skip_first_batches` and `SkipBatchSampler`
    - accelerate `Accelerator.skip_first_batches` docstring ("for the first epoch only")
    - accelerate `examples/by_feature/checkpointing.py` (`active_dataloader`)
    """

    code = "LD205"
    name = "skip-first-batches-reused"
    severity = Severity.WARNING
    fix_kind = "unsafe"
    triggers = ("skip_first_batches",)

    VALID = (
        Valid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
for epoch in range(starting_epoch, num_epochs):
    if resume_step is not None and epoch == starting_epoch:
        active_dataloader = accelerator.skip_first_batches(train_dataloader, resume_step)
    else:
        active_dataloader = train_dataloader
    for batch in active_dataloader:
        accelerator.backward(model(batch).sum())
"""
        ),
        Valid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
for epoch in range(starting_epoch, num_epochs):
    for batch in accelerator.skip_first_batches(train_dataloader, resume_step):
        accelerator.backward(model(batch).sum())
    resume_step = 0
"""
        ),
        Valid(
            """\
from accelerate import skip_first_batches


def train_one_epoch(model, loader, epoch, first_epoch, skip):
    if epoch == first_epoch and skip:
        loader = skip_first_batches(loader, skip)
    for batch in loader:
        model(batch).sum().backward()


for epoch in range(start, epochs):
    train_one_epoch(model, train_loader, epoch, start, resume_step)
"""
        ),
        Valid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
train_dataloader = accelerator.skip_first_batches(train_dataloader, resume_step)
for batch in train_dataloader:
    accelerator.backward(model(batch).sum())
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
if resume_step:
    train_dataloader = accelerator.skip_first_batches(train_dataloader, resume_step)
for epoch in range(starting_epoch, num_epochs):
    model.train()
    for batch in train_dataloader:
        accelerator.backward(model(batch).sum())
    evaluate(model)
""",
            lines=(5,),
            unsafe_fixed="""\
from accelerate import Accelerator

accelerator = Accelerator()
active_dataloader = train_dataloader
if resume_step:
    active_dataloader = accelerator.skip_first_batches(train_dataloader, resume_step)
for epoch in range(starting_epoch, num_epochs):
    model.train()
    for batch in active_dataloader:
        accelerator.backward(model(batch).sum())
    active_dataloader = train_dataloader
    evaluate(model)
""",
        ),
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
for epoch in range(starting_epoch, num_epochs):
    if args.resume_from_checkpoint and epoch == starting_epoch:
        train_dataloader = accelerator.skip_first_batches(train_dataloader, resume_step)
    for step, batch in enumerate(train_dataloader):
        accelerator.backward(model(batch).sum())
""",
            lines=(6,),
            unsafe_fixed="""\
from accelerate import Accelerator

accelerator = Accelerator()
for epoch in range(starting_epoch, num_epochs):
    active_dataloader = train_dataloader
    if args.resume_from_checkpoint and epoch == starting_epoch:
        active_dataloader = accelerator.skip_first_batches(train_dataloader, resume_step)
    for step, batch in enumerate(active_dataloader):
        accelerator.backward(model(batch).sum())
""",
        ),
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
for epoch in range(starting_epoch, args.num_train_epochs):
    for step, batch in enumerate(accelerator.skip_first_batches(train_dataloader, num_batches=resume_step)):
        accelerator.backward(model(**batch).loss)
""",
            lines=(5,),
            unsafe_fixed="""\
from accelerate import Accelerator

accelerator = Accelerator()
for epoch in range(starting_epoch, args.num_train_epochs):
    for step, batch in enumerate(accelerator.skip_first_batches(train_dataloader, num_batches=resume_step) if epoch == starting_epoch else train_dataloader):
        accelerator.backward(model(**batch).loss)
""",
        ),
        Invalid(
            """\
import accelerate

active = train_loader
for epoch in range(3):
    if epoch == 0 and skip:
        active = accelerate.skip_first_batches(train_loader, skip)
    for batch in active:
        model(batch).sum().backward()
""",
            lines=(6,),
            unsafe_fixed="""\
import accelerate

active = train_loader
for epoch in range(3):
    active = train_loader
    if epoch == 0 and skip:
        active = accelerate.skip_first_batches(train_loader, skip)
    for batch in active:
        model(batch).sum().backward()
""",
        ),
        Invalid(
            """\
from accelerate.data_loader import skip_first_batches


def train(model, loader, epochs):
    for batch in loader:
        model(batch).sum().backward()


skipped = skip_first_batches(train_loader, 100)
epoch = 0
while epoch < 3:
    train(model, skipped, 1)
    epoch += 1
""",
            lines=(9,),
            unsafe_fixed="""\
from accelerate.data_loader import skip_first_batches


def train(model, loader, epochs):
    for batch in loader:
        model(batch).sum().backward()


skipped = skip_first_batches(train_loader, 100)
epoch = 0
while epoch < 3:
    train(model, skipped, 1)
    skipped = train_loader
    epoch += 1
""",
        ),
    )

    def finish(self) -> None:
        for skip in filter(self._is_skip, self.facts.calls):
            reuse = self._reuse(skip)
            if reuse is not None:
                self._report(reuse)

    # -- finding the skip and the loops that run it again ------------------------------------------

    def _is_skip(self, call: cst.Call) -> bool:
        func = call.func
        return self.facts.callee_is(call, SKIP_FUNCTIONS) or (
            isinstance(func, cst.Attribute)
            and func.attr.value == "skip_first_batches"
            and accelerator_receiver(self.facts, func.value, call, self.context.text)
        )

    def _reuse(self, skip: cst.Call) -> Reuse | None:
        facts = self.facts
        count = argument_of(skip, "num_batches", 1)
        if count is None or constant_truth(count) is False or argument_of(skip, "dataloader", 0) is None:
            return None
        statement = facts.parent(skip)
        target = None
        if isinstance(statement, cst.Assign) and statement.value is skip:
            if len(statement.targets) != 1 or not isinstance(statement.targets[0].target, (cst.Name, cst.Attribute)):
                return None
            target = get_full_name_for_node(statement.targets[0].target)
        for loop, loader in facts.data_loops():
            if target is None and loader is not skip:
                continue
            if not any(origin.node is skip for origin in facts.origins(loader, loop)):
                continue
            for epoch_loop, loader_there in facts.epoch_loops(loop, loader):
                kind = self._kind(skip, target, loop, epoch_loop, loader_there)
                if kind is not None:
                    return Reuse(skip, kind, epoch_loop, loader_there, target)
        return None

    def _kind(
        self, skip: cst.Call, target: str | None, loop: cst.For, epoch_loop: Loop, loader_there: cst.BaseExpression
    ) -> str | None:
        facts = self.facts
        statement = facts.parent(skip) if target else loop
        if not facts.is_within(skip, epoch_loop):
            if target is None:
                return None
            same_scope = facts.enclosing_function(skip) is facts.enclosing_function(epoch_loop)
            if not same_scope and not target.startswith("self."):
                return None  # a helper's own variable: rebound for that call only
            if same_scope and facts.index.order(skip) > facts.index.order(epoch_loop):
                return None
            if rebound_in(facts, target, epoch_loop, statement) or (
                same_scope and rebound_between(facts, target, statement, epoch_loop)
            ):
                return None
            return "before"
        gates = [a for a in ancestors_inside(facts, statement, epoch_loop) if isinstance(a, cst.If)]
        in_place = any(
            isinstance(a, (cst.IfExp, cst.BooleanOperation)) for a in ancestors_inside(facts, skip, statement)
        )
        if (
            gates
            and not in_place
            and all(facts.within(g.test, cst.Name) and same_each_pass(facts, g.test, epoch_loop) for g in gates)
            and same_each_pass(facts, argument_of(skip, "num_batches", 1), epoch_loop)
        ):
            return "guarded"  # the `else:` that sets the loader back never runs once the guard holds
        if target is not None:
            if rebound_in(facts, target, epoch_loop, statement):
                return None
            if any(not facts.is_within(loader_there, gate) for gate in gates):
                return "stale"
            loader = argument_of(skip, "dataloader", 0)
            if get_full_name_for_node(loader) == target and not gates:
                return "rebind"
        if gates or in_place or not same_each_pass(facts, argument_of(skip, "num_batches", 1), epoch_loop):
            return None
        return "every"

    # -- the report and its fix -----------------------------------------------------------------

    def _report(self, reuse: Reuse) -> None:
        code = self.context.module.code_for_node
        skip = reuse.skip
        count = code(argument_of(skip, "num_batches", 1))
        loader = code(argument_of(skip, "dataloader", 0))
        line = self.context.span(reuse.epoch_loop).line
        what = f"`{reuse.target}`" if reuse.target else "the loader"
        why = f"its `SkipBatchSampler` drops the first `{count}` batches on every pass, not only in the resumed epoch"
        situation = {
            "before": f"{what} skips batches and every epoch of the loop at line {line} iterates it",
            "stale": (
                f"{what} is bound to the skipping loader under an `if` and never set back in the epoch loop at "
                f"line {line}, so the epochs after the resumed one iterate it again"
            ),
            "rebind": f"{what} is rebound to a skipping loader in every epoch of the loop at line {line}",
            "every": f"{what} is made to skip batches in every epoch of the loop at line {line}",
            "guarded": (
                f"{what} is made to skip batches under a guard that nothing in the epoch loop at line {line} "
                "changes, so it stays true in every epoch after the resumed one"
            ),
        }[reuse.kind]
        message = (
            f"{situation}: {why}; iterate `skip_first_batches(...)` in the resumed epoch only and "
            f"`{loader}` in the others (`active_dataloader`, as in accelerate's checkpointing example)"
        )
        if reuse.kind == "guarded":
            message += " (test the epoch too, `and epoch == starting_epoch`, or clear the resume step after it)"
        self.report(skip, message, fix=None if reuse.kind == "guarded" else self._fix(reuse))

    def _fix(self, reuse: Reuse) -> Fix | None:
        facts = self.facts
        skip, loop, there = reuse.skip, reuse.epoch_loop, reuse.loader_there
        loader = argument_of(skip, "dataloader", 0)
        if not isinstance(loader, (cst.Name, cst.Attribute)):
            return None
        loader_key = get_full_name_for_node(loader)
        rebound = assigned_keys(facts, loop)
        if loader_key in rebound - {reuse.target}:
            return None
        statement = facts.parent(skip)
        rebinding = reuse.target == loader_key
        if rebinding and (
            unused_name(facts, facts.enclosing_function(loop) or self.context.module, (ACTIVE,)) is None
            or get_full_name_for_node(there) != loader_key
        ):
            return None
        if reuse.kind in {"every", "rebind"}:
            first = range_start(loop, rebound)
            if first is None:
                return None
            counter, start = first
            test = cst.Comparison(cst.Name(counter), [cst.ComparisonTarget(cst.Equal(), start)])
            message = f"Skip the batches only when `{counter} == {self.context.module.code_for_node(start)}`"
            choice = cst.IfExp(test=test, body=skip, orelse=loader)
            if reuse.kind == "every":
                return Fix(Applicability.UNSAFE, message, replacements=((skip, choice),))
            replace = {
                id(statement): statement.with_changes(targets=[cst.AssignTarget(cst.Name(ACTIVE))], value=choice),
                id(there): cst.Name(ACTIVE),
            }
            return self._edit([statement, there], replace, {}, {}, f"{message}, in `{ACTIVE}`")
        before: dict[int, list[cst.BaseStatement]] = {}
        after: dict[int, list[cst.BaseStatement]] = {}
        holder = ACTIVE if rebinding else reuse.target
        # the skipping loader gets a name of its own, which the epoch loop iterates
        renamed = [statement.targets[0].target, there] if rebinding else []
        if reuse.kind == "stale":
            gate = block_statement(facts, statement, loop.body)
            if gate is None:
                return None
            before[id(gate)] = [_assignment(holder, loader_key)]
            touched = [gate, there, *renamed]
        else:  # "before"
            use = block_statement(facts, there, loop.body)
            if use is None or facts.enclosing_function(statement) is not facts.enclosing_function(loop):
                return None
            after[id(use)] = [_assignment(holder, loader_key)]
            touched = [statement, use, *renamed]
            if rebinding:
                outer = block_statement(facts, statement, facts.parent(loop))
                if outer is None:
                    return None
                if facts.parent(statement) is not outer:  # the skip sits in an `if`: bind the name on every path
                    before[id(outer)] = [_assignment(ACTIVE, loader_key)]
                touched.append(outer)
        replace = {id(node): cst.Name(ACTIVE) for node in renamed}
        verb = f"Iterate `{ACTIVE}`" if rebinding else f"Set `{holder}` back to `{loader_key}`"
        return self._edit(touched, replace, before, after, f"{verb}: skip the batches in the resumed epoch only")

    def _edit(self, touched, replace, before, after, message: str) -> Fix:
        """One replacement of the smallest node holding every edit (statements go in beside the ``touched``)."""
        return Fix(
            Applicability.UNSAFE,
            message,
            replacements=(joint_replacement(self.facts, touched, replace, before, after),),
        )


def _assignment(target: str, value: str) -> cst.SimpleStatementLine:
    return cst.parse_statement(f"{target} = {value}\n")
