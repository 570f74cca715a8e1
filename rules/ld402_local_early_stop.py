"""LD402 local-early-stop: a training loop left on a rank-local condition, so the other ranks hang."""

from __future__ import annotations

import re

import libcst as cst

from lintdist.accelerators import accelerator_methods, accelerator_spelling
from lintdist.edits import unparenthesized
from lintdist.exits import left_loop
from lintdist.facts import MAIN_FLAG_WORDS
from lintdist.model import Applicability, Fix, Severity
from lintdist.rank_values import code_text, joins_every_rank, rank_local_reason
from lintdist.rule import Invalid, Pattern, Rule, Valid
from lintdist.surrounding_tests import surrounding_tests

# The rule's own text trigger: an `if` line that reads a loss/metric/stop flag/rank guard, followed within a few
# lines by a `break`/`return` (or `if c: break` on one line). Read backwards (`Pattern(..., backwards=True)`), so
# the scan starts at each `break`/`return` (a literal) and looks back over the lines above it: forwards, every
# `if` line of a long script was tried against every word (0.15 s on the scripts folder, against 0.03 s).
STOP_WORDS = (
    "loss",
    "metric",
    "patience",
    "score",
    "ppl",
    "perplex",
    "best",
    "stop",
    "improv",
    "nan",
    "finite",
    "main_process",
    "rank",
    "master",
    "is_main",
    "global_zero",
    "wait",
    "reward",
    "f1",
    "bleu",
    "rouge",
    "bad",
    "counter",
    "plateau",
    "verge",
    "early",
    "max_time",
    "elapsed",
    "deadline",
    "time_limit",
    "time_budget",
)
_WORDS_BACKWARDS = "|".join(
    [re.escape(word[::-1]) for word in STOP_WORDS] + [r"\)\(meti", r"\bcca", "_cca", "rucca"]  # item(), acc
)
_IF_LINE_BACKWARDS = rf"[ \t]*:[^\n]*(?:{_WORDS_BACKWARDS})[^\n]* fi"
STOP_LINE = re.compile(
    # `if c: break` / `if c: return` on one line
    rf"(?:kaerb(?<!\wkaerb)|nruter(?<!\wnruter))(?!\w){_IF_LINE_BACKWARDS}"
    # `if c:` then `break` within four lines (each may carry a comment after the colon)
    rf"|kaerb(?<!\wkaerb)[ \t]*\n(?:[^\n]*\n){{0,3}}?(?:[^\n]*#)?{_IF_LINE_BACKWARDS}"
    # `if c:` then `return` on the next line
    rf"|nruter(?<!\wnruter)[ \t]*\n(?:[^\n]*#)?{_IF_LINE_BACKWARDS}"
)
# Signs of a distributed script (an accelerate training loop, a process group, DDP), as plain substrings.
DISTRIBUTION_WORDS = (
    "Accelerator(",
    "accelerator.backward",
    "accelerator.prepare",
    "accelerator.is_main_process",
    "torch.distributed",
    "init_process_group",
    "DistributedDataParallel",
    # a main-process flag (the project's own `distr.is_global_main` too): a test that only several processes need
    *MAIN_FLAG_WORDS,
)


class LocalEarlyStop(Rule):
    """
    ## What it does
    Reports a `break` (or `return`) out of a training loop of a distributed
    script taken on a condition that may hold on some ranks and not others:
    a loss or metric of this rank (`loss.item() < 0.01`,
    `val_loss > best_loss`, `math.isnan(loss.item())`), an early-stopping
    counter or flag (`bad_epochs >= patience`, `watcher.update(eval_loss)`,
    a flag set under such a test or returned by a helper given the loss,
    in this module or another), a wall-clock budget (`time.perf_counter()`,
    `time.time()`: each rank reads its own clock), or any condition under a
    main-process guard (`if accelerator.is_main_process:`, `if rank == 0:`,
    or the project's own flag: `if distr.is_global_main:` where its class
    defines `is_global_main` as a test of the rank against 0, in this
    module or another of the project, or a flag named so whose definition
    is not in sight; a guard inside the loop is itself the sign of several
    processes).
    The loop must do something every rank has to join (a backward pass, a
    `gather`/`reduce`/`all_reduce`, a barrier), directly or in a local
    helper. Step and epoch counters (`step >= max_steps`,
    `completed_steps >= args.max_train_steps`, `iter_num > max_iters`) and
    settings (`args.*`, `config.*`, constants, literals) are the same on
    every rank and are not reported; nor are values reduced or gathered
    across ranks first (`accelerator.gather`, `accelerator.reduce`,
    `dist.all_reduce` on the tensor before `.item()`, a metric fed with
    gathered predictions, a helper of this file that reduces),
    `accelerator.check_trigger()`, a flag broadcast from rank 0
    (`broadcast_object_list`), transformers' `control.should_training_stop`,
    a loop that only the main process runs, an exit taken only in a
    one-process job (`if LOCAL_RANK == -1 and stopper(score): break`, the
    `else` of `if world_size > 1:`, `if not dist.is_initialized(): ...`),
    and scripts with no sign of running on several processes.

    ## Why is this bad?
    Each rank evaluates the condition on its own values. The rank that stops
    leaves the loop while the others go on to the next backward pass or
    collective, which waits for a rank that never comes: the job hangs until
    the process group's timeout (10 to 30 minutes by default) and dies. Under a main-process guard only rank 0 ever stops.

    ## Example
    ```python
    for batch in train_loader:
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if loss.item() < args.target_loss:
            break
    ```

    ## Use instead
    ```python
    for batch in train_loader:
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if loss.item() < args.target_loss:
            accelerator.set_trigger()
        if accelerator.check_trigger():
            break
    ```
    In a raw `torch.distributed` script: `if any_rank(loss.item() <
    args.target_loss): break`, with `from lintdist.runtime import any_rank`
    (an all-reduce MAX of the flag).

    ## Fix safety
    Safe. The fix is offered when the `if` holds only the `break` (or
    `return`), has no `else`, and every rank reaches it (no rank test around
    it in its function). With an accelerator in sight (`accelerator`,
    `self.accelerator`), `if c: break` becomes `if c: accelerator.set_trigger()`
    followed at the same level by `if accelerator.check_trigger(): break`:
    `check_trigger` reduces the flag over all ranks, so every rank stops at
    the same step when any rank's condition holds, and it resets the flag.
    Otherwise the test is wrapped in `any_rank(...)`, imported from
    `lintdist.runtime` (an all-reduce MAX; a plain copy without a process
    group). Both add one small collective each time the test runs. The
    stopping step becomes the first at which any rank's condition holds.
    A stop with more in its body (logging, saving) or nested in a main-process
    guard is reported without a fix: moving it would run that code on every
    rank, or put the collective under the guard.

    ## References
    - accelerate `Accelerator.set_trigger` / `check_trigger` (a reduce of a
      flag tensor; "Sets the internal trigger tensor to 1 on the current
      process. A latter check should follow using this which will check
      across all processes")
    - accelerate pull request #1940 (`set_breakpoint`/`check_breakpoint`,
      later renamed `set_trigger`/`check_trigger`): "a `break` can happen on
      process 0 but not on process 1 ... this will cause the code to hang
      indefinitely until a timeout occurs"
    - Lightning-AI/pytorch-lightning issue #379: early stopping with DDP stalls
      when the stop condition holds on some processes only
    - isi-nlp/rtg issue #11: early stop in distributed training hangs at the
      end of training (barrier calls out of step)
    """

    code = "LD402"
    name = "local-early-stop"
    severity = Severity.ERROR
    needs_several_processes = True
    fix_kind = "safe"
    # the distribution words first: most files hold a `return`, few a sign of several processes
    triggers = DISTRIBUTION_WORDS
    also_triggers = ((Pattern(("break", "return"), STOP_LINE, backwards=True),),)

    VALID = (
        Valid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
completed_steps = 0
for batch in loader:
    accelerator.backward(model(**batch).loss)
    optimizer.step()
    completed_steps += 1
    if completed_steps >= args.max_train_steps:
        break
"""
        ),
        Valid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    loss = model(**batch).loss
    accelerator.backward(loss)
    optimizer.step()
    if loss.item() < args.target:
        accelerator.set_trigger()
    if accelerator.check_trigger():
        break
"""
        ),
        Valid(
            """\
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("nccl")
model = DDP(model)
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    mean_loss = loss.detach().clone()
    dist.all_reduce(mean_loss)
    if mean_loss.item() / dist.get_world_size() < 0.01:
        break
"""
        ),
        Valid(
            """\
loss_history = []
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    if loss.item() < 0.01:
        break
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    loss = model(**batch).loss
    accelerator.backward(loss)
    optimizer.step()
    if loss.item() < args.target:
        break
""",
            lines=(9,),
            fixed="""\
from accelerate import Accelerator

accelerator = Accelerator()
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    loss = model(**batch).loss
    accelerator.backward(loss)
    optimizer.step()
    if loss.item() < args.target:
        accelerator.set_trigger()
    if accelerator.check_trigger():
        break
""",
        ),
        Invalid(
            """\
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("nccl")
model = DDP(model)
best, bad_epochs = float("inf"), 0
for epoch in range(100):
    for x, y in loader:
        criterion(model(x), y).backward()
        optimizer.step()
    val_loss = validate(model)
    if val_loss < best:
        best, bad_epochs = val_loss, 0
    else:
        bad_epochs += 1
    if bad_epochs > 5:
        break
""",
            lines=(16,),
            fixed="""\
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from lintdist.runtime import any_rank

dist.init_process_group("nccl")
model = DDP(model)
best, bad_epochs = float("inf"), 0
for epoch in range(100):
    for x, y in loader:
        criterion(model(x), y).backward()
        optimizer.step()
    val_loss = validate(model)
    if val_loss < best:
        best, bad_epochs = val_loss, 0
    else:
        bad_epochs += 1
    if any_rank(bad_epochs > 5):
        break
""",
        ),
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for epoch in range(10):
    for batch in loader:
        accelerator.backward(model(**batch).loss)
        optimizer.step()
    if accelerator.is_main_process:
        if time_is_up():
            break
""",
            lines=(10,),
        ),
    )

    def finish(self) -> None:
        seen: set[int] = set()
        for exit_node in self.facts.index.nodes(cst.Break, cst.Return):
            found = self._stop(exit_node)
            if found is not None and id(found[0]) not in seen:
                seen.add(id(found[0]))
                self._report(exit_node, *found)

    def _stop(self, exit_node: cst.CSTNode):
        """(the `if` holding the exit, the rank-local value, the guard) or None."""
        facts = self.facts
        loop = left_loop(facts, exit_node)
        if loop is None or not joins_every_rank(facts, loop.body):
            return None
        if facts.single_process_branch(exit_node) is not None:
            return None  # `if local_rank == -1 and stopper(...): break`: taken only when there is one process
        if facts.rank_split(loop) is not None:
            return None  # only some ranks run the loop (`if rank == 0: for episode in ...`): none waits in it
        guard = facts.rank_guard(exit_node)
        if guard is None and not (self.loop.distributed or accelerator_methods(facts, loop)):
            return None  # a main-process guard inside the loop is itself the sign of several processes
        branches = surrounding_tests(facts, exit_node, until=loop)
        local = (r for b in branches if (r := rank_local_reason(facts, b.test, b)) is not None)
        reason = next(local, None) if guard is None else None
        if not branches or (guard is None and reason is None):
            return None
        return branches[0], reason, guard

    # -- the report and the fix -------------------------------------------------------------------

    def _report(self, exit_node, holder: cst.If, reason: str | None, guard) -> None:
        word = "break" if isinstance(exit_node, cst.Break) else "return"
        accelerator = accelerator_spelling(self.facts, holder)
        if accelerator:
            remedy = (
                f"set `{accelerator}.set_trigger()` there and leave with `if {accelerator}.check_trigger(): {word}` "
                "on every rank"
            )
        else:
            remedy = f"leave together with `if any_rank(<condition>): {word}` (`from lintdist.runtime import any_rank`)"
        if guard is not None:
            shown = f" (`{code_text(guard.test)}`)" if isinstance(guard, cst.If) else ""
            message = (
                f"`{word}` out of the training loop under a main-process guard{shown}: only the main process stops, "
                f"the other ranks hang at the next collective; {remedy}"
            )
        else:
            message = (
                f"`{word}` out of the training loop on a rank-local value, {reason}: ranks stop at different steps "
                f"and the others hang at the next collective; {remedy}"
            )
        self.report(holder, message, fix=self._fix(exit_node, holder, accelerator, word))

    def _fix(self, exit_node, holder: cst.If, accelerator: str | None, word: str) -> Fix | None:
        facts = self.facts
        body, line = holder.body, facts.parent(exit_node)
        # the `if` holds only the exit: `if c: break`, or `break` alone in its indented block
        alone = len(facts.within(body, cst.BaseSmallStatement)) == 1 and (line is body or facts.parent(line) is body)
        if holder.orelse is not None or facts.rank_split(holder) is not None or not alone:
            return None
        if not isinstance(facts.parent(holder), (cst.IndentedBlock, cst.Module)):
            return None
        if accelerator:
            set_trigger = cst.Expr(cst.parse_expression(f"{accelerator}.set_trigger()"))
            first = holder.with_changes(body=body.deep_replace(exit_node, set_trigger))
            check = cst.parse_expression(f"{accelerator}.check_trigger()")
            # the trailing comment of `if c:  # why` stays on the first `if`
            plain = body.with_changes(header=cst.TrailingWhitespace()) if isinstance(body, cst.IndentedBlock) else body
            second = holder.with_changes(test=check, body=plain, leading_lines=())
            return Fix(
                Applicability.SAFE,
                f"Set the accelerator's trigger and stop every rank on `{accelerator}.check_trigger()`",
                replacements=((holder, cst.FlattenSentinel([first, second])),),
            )
        if not self.context.runtime_name_free("any_rank"):
            return None
        wrapped = cst.Call(func=cst.Name("any_rank"), args=[cst.Arg(unparenthesized(holder.test))])
        return Fix(
            Applicability.SAFE,
            f"Take the `{word}` on every rank when the condition holds on any: `any_rank(...)`",
            replacements=((holder.test, wrapped),),
            imports=(("lintdist.runtime", "any_rank"),),
        )
