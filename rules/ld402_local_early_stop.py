"""LD402 local-early-stop: a training loop left on a rank-local condition, so the other ranks hang."""

from __future__ import annotations

import re

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import MAIN_FLAG_WORDS
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Pattern, Rule, Valid

# Calls whose value is the same on every rank: a reduction or gather across ranks, accelerate's trigger, a broadcast.
REDUCING = frozenset(
    {
        "gather",
        "gather_for_metrics",
        "gather_object",
        "reduce",
        "all_reduce",
        "all_gather",
        "all_gather_object",
        "all_gather_into_tensor",
        "broadcast",
        "broadcast_object_list",
        "check_trigger",
        "any_rank",
        "reduce_dict",
        "all_reduce_mean",
        "sync_across_processes",
    }
)
# torch.distributed collectives that write their result into their first argument.
IN_PLACE = frozenset({"all_reduce", "reduce", "broadcast", "broadcast_object_list", "all_gather", "all_gather_object"})
# Collectives (or collective-making calls) in a loop body: a rank that leaves the loop early skips them.
COLLECTIVE_METHODS = REDUCING | frozenset(
    {"backward", "wait_for_everyone", "barrier", "pad_across_processes", "save_state", "reduce_scatter"}
)
# Words of a name that holds a rank-local value: a loss, a metric, an early-stopping counter or flag.
LOCAL_WORD = re.compile(
    r"loss|metric|acc(?!el|um)|patience|score|ppl|perplex|best|stop|improve|plateau|bad_|_bad|f1|bleu|rouge|reward|"
    r"nan|finite|grad_norm|converge|diverge|wait|no_gain|tolerance",
    re.IGNORECASE,
)
# Calls that test a value for NaN/inf: their argument is what matters.
VALUE_TESTS = frozenset({"isnan", "isinf", "isfinite", "any", "all", "abs", "float", "int", "bool", "round"})
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
# Wall-clock readings: each rank reads its own, so a time budget runs out at different steps on different ranks.
CLOCKS = frozenset({"time.time", "time.perf_counter", "time.monotonic", "time.time_ns", "time.perf_counter_ns"})
# Objects that hold the run's settings: the same on every rank.
CONFIG_ROOTS = frozenset(
    {"args", "config", "cfg", "conf", "opt", "opts", "hparams", "hp", "params", "FLAGS", "settings"}
)
# Flags every rank holds alike: transformers' `TrainerControl` is set by callbacks from gathered metrics and step
# counts on every process.
UNIFORM_FLAGS = frozenset({"should_training_stop", "should_epoch_stop"})


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
        facts = self.facts
        seen: set[int] = set()
        for exit_node in facts.index.nodes(cst.Break, cst.Return):
            found = self._stop(exit_node)
            if found is None:
                continue
            holder, loop, reason, guard = found
            if id(holder) in seen:
                continue
            seen.add(id(holder))
            self._report(exit_node, holder, loop, reason, guard)

    # -- what leaves which loop ---------------------------------------------------------------

    def _stop(self, exit_node: cst.CSTNode):
        """(the `if` holding the exit, the training loop it leaves, the rank-local value, the guard) or None."""
        facts = self.facts
        loop = self._left_loop(exit_node)
        if loop is None or not self._collective_loop(loop):
            return None
        if facts.single_process_branch(exit_node) is not None:
            return None  # `if local_rank == -1 and stopper(...): break`: taken only when there is one process
        if facts.rank_split(loop) is not None:
            return None  # only some ranks run the loop (`if rank == 0: for episode in ...`): none waits in it
        guard = facts.rank_guard(exit_node)
        if guard is None and not self._distributed(loop):
            return None  # a main-process guard inside the loop is itself the sign of several processes
        holder = None
        reason = None
        child = exit_node
        for ancestor in facts.ancestors(exit_node):
            if ancestor is loop:
                break
            if isinstance(ancestor, cst.If) and child is not ancestor.test:
                if holder is None:
                    holder = ancestor
                if guard is None and reason is None:
                    reason = self._local(ancestor.test, ancestor, 0)
            child = ancestor
        if holder is None or (guard is None and reason is None):
            return None
        return holder, loop, reason, guard

    def _left_loop(self, exit_node: cst.CSTNode):
        """The loop a `break` leaves; for a `return`, the outermost loop around it in its function."""
        facts = self.facts
        if isinstance(exit_node, cst.Break):
            return facts.enclosing_loop(exit_node) or self._loop_of_break(exit_node)
        outer = None
        for ancestor in facts.ancestors(exit_node):
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                break
            if isinstance(ancestor, (cst.For, cst.While)):
                outer = ancestor
        return outer

    def _loop_of_break(self, exit_node: cst.CSTNode):
        for ancestor in self.facts.ancestors(exit_node):
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                return None
            if isinstance(ancestor, (cst.For, cst.While)):
                return ancestor
        return None

    def _collective_loop(self, loop) -> bool:
        """The loop's body does something every rank must join: a backward pass (a wrapped model's gradient
        all-reduce) or a collective, directly or in a local helper."""
        memo = self.facts._memo.setdefault("ld402_collective_loops", {})
        if id(loop) not in memo:
            facts = self.facts
            memo[id(loop)] = any(
                facts.method_name(call) in COLLECTIVE_METHODS for call in facts.reachable_calls(loop.body)
            )
        return memo[id(loop)]

    def _distributed(self, loop) -> bool:
        if self.loop.distributed:
            return True
        facts = self.facts
        return any(
            isinstance(call.func, cst.Attribute)
            and isinstance(call.func.value, (cst.Name, cst.Attribute))
            and facts.accelerator_like(call.func.value, call)
            for call in facts.calls_within(loop)
        )

    # -- is a condition rank-local? ---------------------------------------------------------------

    def _local(self, test: cst.BaseExpression, at: cst.CSTNode, depth: int) -> str | None:
        """Why ``test`` may differ between ranks (the rank-local value it reads), or None."""
        facts = self.facts
        calls = [c for c in facts.index.within(test, cst.Call)]
        if any(facts.method_name(c) in REDUCING for c in calls):
            return None
        for call in calls:
            # a helper of this file that agrees across ranks (`if should_stop_all(val_loss):`)
            if any(
                facts.method_name(inner) in REDUCING
                for function in facts.local_functions(call)
                for inner in facts.reachable_calls(function)
            ):
                return None
        for call in calls:
            if facts.callee_is(call, CLOCKS):
                return f"`{_code(call)}` (each rank reads its own clock)"
        for call in calls:
            if facts.method_name(call) == "item" and isinstance(call.func, cst.Attribute):
                receiver = call.func.value
                key = _root_key(receiver)
                if key is None or not self._reduced(key, at, 0):
                    return f"`{_code(call)}`"
        keys = []
        for node in _atoms(facts, test):
            key = get_full_name_for_node(node)
            if not key or key in {"True", "False", "None"} or key in keys:
                continue
            if _counter_name(key.rsplit(".", 1)[-1]) or self._uniform(key, node) or self._reduced(key, at, 0):
                continue
            keys.append(key)
        for key in keys:
            last = key.rsplit(".", 1)[-1]
            if LOCAL_WORD.search(last) and not _counter_name(last):
                return f"`{key}`"
        for call in calls:
            # a value computed by a function named for a loss or metric (`validation_loss(model, loader)`)
            callee = get_full_name_for_node(call.func) or ""
            last = callee.rsplit(".", 1)[-1]
            if last and LOCAL_WORD.search(last) and not _counter_name(last):
                return f"`{callee}(...)`"
        if depth < 2:
            for key in keys:
                for binding in facts.bindings(key, at):
                    why = self._local_binding(binding, depth)
                    if why:
                        return f"`{key}` ({why})"
        return None

    def _uniform(self, key: str, node: cst.CSTNode) -> bool:
        """A setting every rank holds alike: a command-line or config field (`args.patience`,
        `self.config.early_stop`), a constant (`PATIENCE`), a parameter with a literal default, a name bound only to
        literals, or a `TrainerControl` flag."""
        parts = key.split(".")
        if parts[-1] in UNIFORM_FLAGS or parts[-1].isupper():
            return True
        if parts[0] in {"self", "cls"}:
            parts = parts[1:]
        if len(parts) > 1 and (parts[0] in CONFIG_ROOTS or parts[0].endswith(("args", "config", "cfg"))):
            return True
        facts = self.facts
        bindings = facts.bindings(key, node)
        if bindings:
            return all(_literal(b.value) for b in bindings) and not self._counted(key)
        found = facts.parameter(key, node) if len(parts) == 1 and "." not in key else None
        return found is not None and found[2].default is not None and _literal(found[2].default)

    def _counted(self, key: str) -> bool:
        """``key += ...`` somewhere in the file: a counter (`patience += 1`), not a setting."""
        memo = self.facts._memo.setdefault("ld402_counted", None)
        if memo is None:
            memo = {get_full_name_for_node(node.target) for node in self.facts.index.nodes(cst.AugAssign)}
            self.facts._memo["ld402_counted"] = memo
        return key in memo

    def _local_binding(self, binding, depth: int) -> str | None:
        """A flag or value set from a rank-local value, or set under a rank-local test."""
        facts = self.facts
        value = binding.value
        if not isinstance(value, cst.Name) or value.value not in {"True", "False", "None"}:
            why = self._local(value, binding.statement, depth + 1)
            if why:
                return f"set from {why}"
        for ancestor in facts.ancestors(binding.statement):
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Module)):
                break
            if isinstance(ancestor, cst.If):
                why = self._local(ancestor.test, ancestor, depth + 1)
                if why:
                    return f"set under a test of {why}"
        return None

    def _reduced(self, key: str, at: cst.CSTNode, depth: int) -> bool:
        """``key`` holds a value made the same on every rank: bound from a reduction or gather (or from a helper
        that reduces, or from names that are), reduced in place (`dist.all_reduce(t)`), or fed with gathered
        values (`metric.add_batch(accelerator.gather_for_metrics(...))` ... `metric.compute()`)."""
        facts = self.facts
        memo = facts._memo.setdefault("ld402_reduced", {})
        scope = facts.enclosing_function(at)
        token = (key, id(scope), depth)
        if token in memo:
            return memo[token]
        memo[token] = False
        answer = False
        for binding in facts.bindings(key, at):
            if self._reducing_value(binding.value, depth):
                answer = True
                break
        if not answer:
            container = scope if scope is not None else self.context.module
            root = key.split(".", 1)[0] if not key.startswith("self.") else key
            for call in facts.calls_within(container):
                method = facts.method_name(call)
                receiver = _root_key(call.func.value) if isinstance(call.func, cst.Attribute) else None
                first = _root_key(call.args[0].value) if call.args else None
                if (
                    method in IN_PLACE
                    and first == root
                    and isinstance(facts.parent(call), cst.Expr)
                    and not facts.is_within(at, call)
                ):
                    answer = True  # dist.all_reduce(t) as a statement: `t` now holds the sum over ranks
                    break
                if receiver == root and self._reducing_arguments(call, depth):
                    answer = True  # losses.append(accelerator.gather(...)), metric.add_batch(predictions=gathered)
                    break
        memo[token] = answer
        return answer

    def _reducing_value(self, value: cst.BaseExpression, depth: int) -> bool:
        facts = self.facts
        calls = facts.index.within(value, cst.Call)
        for call in calls:
            if facts.method_name(call) in REDUCING:
                return True
            for function in facts.local_functions(call):
                if any(facts.method_name(c) in REDUCING for c in facts.reachable_calls(function)):
                    return True
        if depth < 3:
            for call in calls:
                # `metric.compute()` of a metric fed with gathered values
                receiver = _root_key(call.func.value) if isinstance(call.func, cst.Attribute) else None
                if receiver and self._reduced(receiver, value, depth + 1):
                    return True
            for node in _atoms(facts, value):
                key = get_full_name_for_node(node)
                if key and key not in {"True", "False", "None"} and self._reduced(key, value, depth + 1):
                    return True
        return False

    def _reducing_arguments(self, call: cst.Call, depth: int) -> bool:
        """``call`` is given a gathered or reduced value: a reducing call inside it, or a name that holds one."""
        facts = self.facts
        if any(facts.method_name(c) in REDUCING for c in facts.calls_within(call)):
            return True
        if depth >= 3:
            return False
        for arg in call.args:
            for node in _atoms(facts, arg.value):
                key = get_full_name_for_node(node)
                if key and self._reduced(key, call, depth + 1):
                    return True
        return False

    # -- the report and the fix -------------------------------------------------------------------

    def _report(self, exit_node, holder: cst.If, loop, reason: str | None, guard) -> None:
        word = "break" if isinstance(exit_node, cst.Break) else "return"
        accelerator = self._accelerator(holder)
        if accelerator:
            remedy = (
                f"set `{accelerator}.set_trigger()` there and leave with `if {accelerator}.check_trigger(): {word}` "
                "on every rank"
            )
        else:
            remedy = f"leave together with `if any_rank(<condition>): {word}` (`from lintdist.runtime import any_rank`)"
        if guard is not None:
            test = guard.test if isinstance(guard, cst.If) else None
            shown = f" (`{_code(test)}`)" if test is not None else ""
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
        if holder.orelse is not None or facts.rank_split(holder) is not None:
            return None
        body = holder.body
        statements = body.body
        if isinstance(body, cst.IndentedBlock):
            if len(statements) != 1 or not isinstance(statements[0], cst.SimpleStatementLine):
                return None
            small = statements[0].body
        else:
            small = statements
        if len(small) != 1 or small[0] is not exit_node:
            return None
        parent = facts.parent(holder)
        if not isinstance(parent, (cst.IndentedBlock, cst.Module)):
            return None
        if accelerator:
            set_line = cst.parse_statement(f"{accelerator}.set_trigger()\n")
            if isinstance(body, cst.IndentedBlock):
                new_body = body.with_changes(body=[statements[0].with_changes(body=set_line.body)])
            else:
                new_body = body.with_changes(body=set_line.body)
            first = holder.with_changes(body=new_body)
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
        test = holder.test
        wrapped = cst.Call(
            func=cst.Name("any_rank"),
            args=[cst.Arg(test.with_changes(lpar=(), rpar=()) if test.lpar else test)],
        )
        return Fix(
            Applicability.SAFE,
            f"Take the `{word}` on every rank when the condition holds on any: `any_rank(...)`",
            replacements=((holder.test, wrapped),),
            imports=(("lintdist.runtime", "any_rank"),),
        )

    def _accelerator(self, at: cst.CSTNode) -> str | None:
        """The spelling of the accelerator in ``at``'s function (or the module): the receiver of an accelerator
        method called there (`accelerator`, `self.accelerator`)."""
        facts = self.facts
        function = facts.enclosing_function(at)
        scopes = [function] if function is not None else []
        scopes.append(self.context.module)
        for scope in scopes:
            for call in facts.calls_within(scope):
                if scope is self.context.module and function is not None and facts.is_within(call, function):
                    continue
                func = call.func
                if not isinstance(func, cst.Attribute) or not isinstance(func.value, (cst.Name, cst.Attribute)):
                    continue
                if scope is self.context.module and facts.enclosing_function(call) is not None:
                    continue
                name = get_full_name_for_node(func.value)
                if name and not name.startswith("torch.") and facts.accelerator_like(func.value, call):
                    return name
        return None


def _atoms(facts, expr: cst.BaseExpression) -> list[cst.CSTNode]:
    """The names and attribute chains ``expr`` reads, outermost (``a.b.c``, not ``a.b``), not the callee of a call."""
    found = []
    for node in facts.index.within(expr, cst.Name, cst.Attribute):
        parent = facts.parent(node)
        if isinstance(parent, cst.Attribute) and parent.value is node:
            continue  # part of a longer chain
        if isinstance(parent, cst.Attribute) and parent.attr is node:
            continue
        if isinstance(parent, cst.Call) and parent.func is node:
            continue
        if isinstance(parent, cst.Arg) and parent.keyword is node:
            continue
        found.append(node)
    return found


def _literal(expr: cst.BaseExpression) -> bool:
    """A number, string, bool or None (possibly negated): ``5``, ``-1``, ``1e-3``, ``float("inf")``."""
    if isinstance(expr, cst.UnaryOperation):
        expr = expr.expression
    if isinstance(expr, (cst.Integer, cst.Float, cst.SimpleString)):
        return True
    if isinstance(expr, cst.Name):
        return expr.value in {"True", "False", "None"}
    return (
        isinstance(expr, cst.Call)
        and get_full_name_for_node(expr.func) in {"float", "int"}
        and all(_literal(a.value) for a in expr.args)
    )


def _root_key(expr: cst.BaseExpression) -> str | None:
    """``losses`` of ``losses[0].mean()``; ``self.x`` of ``self.x.y``."""
    while True:
        if isinstance(expr, cst.Call):
            expr = expr.func.value if isinstance(expr.func, cst.Attribute) else expr.func
        elif isinstance(expr, cst.Subscript) or (
            isinstance(expr, cst.Attribute)
            and not (isinstance(expr.value, cst.Name) and expr.value.value in {"self", "cls"})
        ):
            expr = expr.value
        else:
            break
    return get_full_name_for_node(expr) if isinstance(expr, (cst.Name, cst.Attribute)) else None


COUNTER_PART = re.compile(r"(?:^|_)(?:steps?|epochs?|iters?|iterations?|updates?|batch(?:es)?|samples|tokens)(?:$|_)")
FOLLOWS_METRIC = re.compile(r"patience|best|stop|wait|loss|metric|bad|improve|score|acc(?!el|um)")


def _counter_name(name: str) -> bool:
    """A step or epoch count (`eval_steps`, `max_train_steps`); not `best_step`, which follows a metric."""
    lower = name.lower()
    return bool(COUNTER_PART.search(lower)) and not FOLLOWS_METRIC.search(lower)


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node).strip()
