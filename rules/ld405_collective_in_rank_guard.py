"""LD405 collective-in-rank-guard: a collective call that only the main process reaches, so the job hangs."""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist import sharding
from lintdist.collectives import (
    COLLECTIVE_TEXTS,
    collective_elsewhere,
    collective_kind,
    joined_by_others,
    others_only_collectives,
)
from lintdist.hoist import NoHoist, Ordering, collective_ordering, split_guard
from lintdist.main_process import MAIN_GUARD_TEXTS, main_only, main_or_deepspeed_guard
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Rule, Valid

# A model export (weights only): not a training checkpoint, which `save_state` on every rank writes.
ALL_RANKS_PATTERN = (
    "call it on every rank (`sd = accelerator.get_state_dict(model)`) and keep only the write under the guard "
    "(`accelerator.save(sd, path)`, or `accelerator.unwrap_model(model).save_pretrained(d, "
    "is_main_process=accelerator.is_main_process, state_dict=sd)`); this exports the model's weights only, while a "
    "training checkpoint (optimizer, scheduler, RNG and dataloader state) is `accelerator.save_state(d)` on every rank"
)
SAVE_MODEL_REMEDY = "call it on every rank: it writes the files on the main process only"
# What a main-only `save_state`, `save_model` or `get_state_dict` does under each backend (accelerate 1.15), for
# a project that selects none under which it hangs.
_BY_BACKEND = {
    "save_state": (
        "hangs under FSDP and under DeepSpeed at every ZeRO stage, where it is a collective (the engine's "
        "`save_checkpoint`), and under any backend with `automatic_checkpoint_naming` (it calls "
        "`wait_for_everyone()`); under DDP without automatic naming only the other ranks' RNG state "
        "(`random_states_<i>.pkl`) is lost"
    ),
    "save_model": (
        "hangs under FSDP and DeepSpeed ZeRO-3, where it gathers the model's shards; under DDP and DeepSpeed "
        "ZeRO-1/2 it writes the same files, as it writes them on the main process only"
    ),
    "get_state_dict": (
        "hangs under FSDP and DeepSpeed ZeRO-3, where it gathers the model's shards; under DDP and DeepSpeed "
        "ZeRO-1/2 it returns the local weights, and the guard costs nothing"
    ),
}
UNSELECTED = "nothing in this project selects FSDP or DeepSpeed"


class CollectiveInRankGuard(Rule):
    """
    ## What it does
    Reports a collective operation (one that every process must call) that
    only the main process can reach: inside `if accelerator.is_main_process:`,
    `if rank == 0:`, `if dist.get_rank() == 0:`, `if local_rank in (-1, 0):`,
    after `if not accelerator.is_main_process: return`, in a function
    decorated with `@accelerator.on_main_process`, or in a local helper
    called from such a place. The collectives are accelerate's `gather`,
    `gather_for_metrics`, `reduce`, `pad_across_processes`,
    `wait_for_everyone`, `check_trigger` (as methods of an `Accelerator` or
    `PartialState`, and `gather`, `gather_object`, `broadcast`,
    `broadcast_object_list`, `reduce`, `pad_across_processes` as functions of
    `accelerate.utils`), `save_state` (collective under FSDP,
    under DeepSpeed at every ZeRO stage, where it calls the engine's
    `save_checkpoint`, and under any backend with
    `automatic_checkpoint_naming`, where it calls `wait_for_everyone()`),
    `save_model` and `get_state_dict` (they gather the shards under FSDP and
    DeepSpeed ZeRO-3), the `torch.distributed` collectives,
    `torch.distributed.checkpoint` `save`/`load` and its state-dict getters,
    FSDP `state_dict()` under a full or sharded `state_dict_type`, and a
    DeepSpeed engine's `save_checkpoint`. One finding per guarded block, at
    the first collective it reaches. The other side is reported too: a
    collective in the branch that leaves the main process out (the `else:`
    of `if accelerator.is_main_process:`, `if rank != 0:`) that the main
    process makes nowhere in the same top-level function. A guard such as
    `if accelerator.distributed_type == DistributedType.DEEPSPEED or
    accelerator.is_main_process:` lets every rank in under DeepSpeed only.
    A plain collective under it (`wait_for_everyone`, `gather`) hangs under
    DDP and FSDP and is reported unless the launch selects DeepSpeed.
    `save_state`, `save_model` and `get_state_dict` under it are right under
    DeepSpeed and DDP (where they save locally), and hang only under FSDP: they
    are reported only where something says FSDP (the launch settings, an
    FSDP plugin built in the script: errors; a `DistributedType.FSDP` test in
    the script: a warning), or, for `save_state`, where
    `ProjectConfiguration(automatic_checkpoint_naming=True)` makes it wait
    for every rank under any backend (an error).

    ## Why is this bad?
    A collective completes only when every process of the group joins it.
    The other ranks skip the guarded block, so the main process waits
    forever (or until the backend's timeout), and the others hang at their
    next collective. The classic cases are `save_state` or `get_state_dict`
    under `is_main_process` with FSDP or DeepSpeed, and a `gather` for
    logging on rank 0 only. `save_state` also writes each rank's RNG state
    (`random_states_<i>.pkl`): under a main-process guard, even under DDP,
    only rank 0's is saved. `accelerator.save`, `torch.save`,
    `unwrap_model(model).state_dict()` and point-to-point `send`/`recv` are
    not collectives and are not reported; nor are collectives on an explicit
    sub-group (`group=`), collectives under `if world_size > 1:` or
    `if dist.is_initialized():`, or the `dist.barrier()` in `if rank == 0:`
    that closes the rank-0-first idiom (paired with a barrier under
    `if rank != 0:`), nor a root collective such as
    `dist.gather(t, out, dst=0)` whose `else:` branch (or the branch that
    excludes the main process) makes the same call.

    ## Example
    ```python
    if accelerator.is_main_process:
        if global_step % args.checkpointing_steps == 0:
            remove_old_checkpoints(args.output_dir)
            save_path = os.path.join(args.output_dir, f"checkpoint-{global_step}")
            accelerator.save_state(save_path)
            logger.info(f"Saved state to {save_path}")
    ```

    ## Use instead
    ```python
    if global_step % args.checkpointing_steps == 0:
        if accelerator.is_main_process:
            remove_old_checkpoints(args.output_dir)
        save_path = os.path.join(args.output_dir, f"checkpoint-{global_step}")
        accelerator.wait_for_everyone()  # the rotation ends before any rank creates the new folder
        accelerator.save_state(save_path)  # writes the model files on the main process only
        if accelerator.is_main_process:
            logger.info(f"Saved state to {save_path}")
    ```
    For a model export, `sd = accelerator.get_state_dict(model)` on every
    rank, then `save_pretrained(d, state_dict=sd)` under the guard: that is
    weights only, not a training checkpoint (no optimizer, scheduler, RNG or
    dataloader state), which `save_state` on every rank writes.

    ## Fix safety
    The fix is offered only where every rank provably reaches the guard:
    every caller of its function, in this file and in the project's other
    modules, is known and none sits under a rank test; otherwise the message
    says why. A collective in another module's helper called under a guard
    is reported at the call, with no fix. The fix is unsafe: statements move. It takes the collective out of the
    guard, with the `if` conditions around it and the assignments that set
    up its arguments (`save_path = ...`); a value-returning collective nested
    in a larger statement (`save_pretrained(d,
    state_dict=accelerator.get_state_dict(m))`) is first bound to a new name
    on every rank. Every other statement (checkpoint rotation, logging,
    uploads) stays under a copy of the guard's test, in its place, so the
    main process runs what it ran before, in the same order (with the
    barrier below where one is needed). It is safe when
    the hoisted conditions and set-up values are the same on every rank
    (step counters, `args.*`) and the moved assignments have no side
    effects: lintdist checks that they read no rank, no per-rank value
    (`.item()`, a rank-derived name) and call only pure helpers
    (`os.path.join`, `unwrap_model`, ...), but cannot prove that the values
    agree, and the other ranks now also evaluate them. Where rank-0 work
    that stays under the guard comes before a `save_state` or `save_model`
    (checkpoint rotation that lists the output folder and deletes the oldest
    checkpoints), the fix puts `accelerator.wait_for_everyone()` just before
    the moved call, on the Accelerator as the code there names it (the
    call's receiver; for a helper's call, its argument that holds one or
    the guard's `accelerator.is_main_process`; no fix where neither does):
    both create the folder and write files on every rank
    (`random_states_<i>.pkl`, the shards), and without the barrier the other
    ranks could create the new checkpoint folder before the main process
    lists the old ones; the rotation then counts the new folder, deleting one
    old checkpoint too many, or, with a limit of 1, the new folder with the
    other ranks' files in it. Every rank reaches that barrier, since it
    reaches the moved call. No barrier is added where no rank-0 work
    precedes the call, where a barrier already stands between them, or
    before a collective that writes nothing on the other ranks (`gather`,
    `get_state_dict`). A helper called under the guard
    (`checkpoint(args, step, accelerator)`) has its call moved the same way
    when its body does nothing a rank must not repeat: it only sets names
    from pure values, calls collectives and logs (a `logger.*` call,
    accelerate's logger logging on the main process by default, or
    `accelerator.print`). Guards nested in the guard
    (`if sync and accelerator.is_main_process:` around
    `if accelerator.is_main_process:`) are split as one: the outermost is
    split, and the statements of an inner guard testing the same process
    join the copies of its test. No fix is offered when the collective sits
    in a helper that does more (writes files, calls `save_pretrained` or code
    lintdist cannot read: on every rank it would run more than the
    collective), under an early `return` or a decorator
    guard, in a `for`/`with`/`try` block or an `else` of the guard, when a
    condition or set-up reads the rank, when the rank-0 code can leave the
    block early, or when a name the moved code binds is read elsewhere.
    `save_state`, `save_model` and `get_state_dict` under a main-process
    guard are errors when the script or its launch configuration selects
    FSDP or DeepSpeed (and `save_state` when
    `ProjectConfiguration(automatic_checkpoint_naming=True)` makes it wait
    for every rank under any backend), warnings when the script only tests
    `DistributedType.FSDP` (it is meant to run under FSDP, as for the
    DeepSpeed-or-main guard), and info otherwise, the message saying what
    the call does under each backend: `save_state` hangs under FSDP and
    DeepSpeed, while under DDP without automatic naming only the other
    ranks' RNG state (`random_states_<i>.pkl`) is lost; `get_state_dict` and
    `save_model` hang under FSDP and DeepSpeed ZeRO-3, while under DDP and
    ZeRO-1/2 they read the local weights (and `save_model` writes on the main
    process only), so the guard costs nothing there.

    ## References
    - accelerate `Accelerator.save_state` (FSDP: `save_fsdp_model`; DeepSpeed:
      `model.save_checkpoint` at every stage; per-rank
      `random_states_<i>.pkl`), `get_state_dict` and `save_model`
    - accelerate issue #2000: `save_state` under `is_main_process` hangs with FSDP
    - diffusers issue #2606: `save_state` hangs with DeepSpeed (the reason
      for the DeepSpeed-or-main guard in diffusers' training scripts)
    - `torch.distributed` collective communication documentation: "all
      processes in the group must call this function"
    """

    code = "LD405"
    name = "collective-in-rank-guard"
    severity = Severity.ERROR
    needs_several_processes = True
    fix_kind = "unsafe"
    triggers = ("distributed", "accelerat", "deepspeed")
    # a main-process guard, and a collective
    also_triggers = (MAIN_GUARD_TEXTS, COLLECTIVE_TEXTS)

    VALID = (
        Valid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
state_dict = accelerator.get_state_dict(model)
if accelerator.is_main_process:
    accelerator.save(state_dict, "model.pt")
    torch.save(accelerator.unwrap_model(model).state_dict(), "plain.pt")
"""
        ),
        Valid(
            """\
import torch.distributed as dist

def prepare(rank):
    if rank != 0:
        dist.barrier()
    build_cache()
    if rank == 0:
        dist.barrier()
"""
        ),
        Valid(
            """\
import torch.distributed as dist

if dist.is_initialized() and dist.get_world_size() > 1:
    dist.all_reduce(total)
if rank == 0:
    dist.send(total, dst=1)
    dist.all_reduce(total, group=first_node)
"""
        ),
        Valid(
            """from accelerate import Accelerator
from accelerate.utils import DistributedType

accelerator = Accelerator()
if accelerator.is_main_process or accelerator.distributed_type == DistributedType.DEEPSPEED:
    accelerator.save_state("ckpt")  # every rank under DeepSpeed; a local save under DDP; nothing says FSDP
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
if accelerator.is_main_process:
    write_report(results)
else:
    accelerator.wait_for_everyone()
""",
            lines=(7,),
        ),
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
for batch in loader:
    loss = model(batch)
    if accelerator.is_main_process:
        losses = accelerator.gather(loss)
        print(losses.mean())
""",
            lines=(7,),
            unsafe_fixed="""\
from accelerate import Accelerator

accelerator = Accelerator()
for batch in loader:
    loss = model(batch)
    losses = accelerator.gather(loss)
    if accelerator.is_main_process:
        print(losses.mean())
""",
        ),
        Invalid(
            """\
import os

from accelerate import Accelerator

accelerator = Accelerator()
for step, batch in enumerate(loader):
    global_step += 1
    if accelerator.is_main_process:
        if global_step % args.checkpointing_steps == 0:
            prune_checkpoints(args.output_dir)  # keep the last three
            save_path = os.path.join(args.output_dir, f"checkpoint-{global_step}")
            accelerator.save_state(save_path)
            print(f"saved {save_path}")
""",
            lines=(12,),
            unsafe_fixed="""\
import os

from accelerate import Accelerator

accelerator = Accelerator()
for step, batch in enumerate(loader):
    global_step += 1
    if global_step % args.checkpointing_steps == 0:
        if accelerator.is_main_process:
            prune_checkpoints(args.output_dir)  # keep the last three
        save_path = os.path.join(args.output_dir, f"checkpoint-{global_step}")
        accelerator.wait_for_everyone()
        accelerator.save_state(save_path)
        if accelerator.is_main_process:
            print(f"saved {save_path}")
""",
        ),
        Invalid(
            """\
import torch.distributed as dist

def log_metrics(total):
    dist.all_reduce(total)
    print(total)

def train(rank):
    if dist.get_rank() == 0:
        log_metrics(total)
""",
            lines=(4,),
        ),
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()

def save(output_dir):
    if not accelerator.is_main_process:
        return
    accelerator.wait_for_everyone()
    accelerator.save_model(model, output_dir)
""",
            lines=(8,),
        ),
    )

    def finish(self) -> None:
        facts = self.facts
        found: dict[int, list[tuple[cst.Call, str, cst.CSTNode, cst.Call | None, bool]]] = {}
        for call in facts.calls:
            what = collective_kind(facts, call)
            if what is None:
                continue
            hit, either = main_only(facts, call), False
            if hit is None and (guard := main_or_deepspeed_guard(facts, call)) is not None:
                hit, either = (guard, None), True
            if hit is not None and not joined_by_others(facts, hit[1] or call):
                found.setdefault(id(hit[0]), []).append((call, what, hit[0], hit[1], either))
        for call, guard, *reached in self._helpers_elsewhere():
            if id(guard) not in found:
                self._report_elsewhere(call, guard, *reached)
        self._others_only_collectives()
        order = facts.index.order
        for group in found.values():
            # one finding per guarded block, at the first collective it reaches
            group.sort(key=lambda item: (order(item[3] or item[0]), order(item[0])))
            call, what, guard, via, either = group[0]
            settings, method = self.context.settings, facts.method_name(call)
            if either and not sharding.hangs_under_main_or_deepspeed(facts, settings, what, method, self._line):
                continue
            # each collective, or the helper call reaching it, once, in order, with how it is ordered
            firsts = {}
            for other, _, _, other_via, _ in group:
                firsts.setdefault(id(other_via or other), (other_via or other, other, other_via))
            anchors = [anchor for anchor, _, _ in firsts.values()]
            orderings = {key: collective_ordering(facts, c, v, guard) for key, (_, c, v) in firsts.items()}
            self._report(call, what, guard, via, either, anchors, orderings)

    # -- collectives in the project's other modules -------------------------------------------

    def _helpers_elsewhere(self) -> list[tuple[cst.Call, cst.CSTNode, cst.Call, str, Rule]]:
        """Calls under a main-process guard of functions defined in the project's other modules that reach a
        collective there (the first one), with the guard, the collective, its kind and this rule asked of that
        module. The guard is found first: only a guarded call's module is read."""
        facts = self.facts
        found = []
        for call in facts.calls if facts.project is not None else ():
            if not any(facts.project.of_project(q) for q in facts.qualified_names(call.func)):
                continue
            hit = main_only(facts, call)
            reached = collective_elsewhere(facts, call) if hit is not None else None
            if reached is not None:
                other, inner, what = reached
                found.append((call, hit[0], inner, what, self.elsewhere(other)))
        return found

    def _report_elsewhere(self, call: cst.Call, guard, inner: cst.Call, what: str, there: Rule) -> None:
        helper = get_full_name_for_node(call.func) or "this helper"
        reached = get_full_name_for_node(inner.func) or "a collective"
        place = f"{there.context.path.name}:{there.context.span(inner).line}"
        line = self.context.span(guard).line
        remedy = (
            "call the helper on every rank and keep only the file writes and logging under the guard "
            "(no automatic fix: the collective is in another module)"
        )
        method = there.facts.method_name(inner)
        if not sharding.needs_every_rank(self.facts, self.context.settings, what, method):
            # nothing in the project selects a backend under which it hangs: say what it costs under each
            message = (
                f"`{helper}()` reaches `{reached}()` ({place}), and only the main process calls it here (the "
                f"main-process guard at line {line}): `{reached}()` {_BY_BACKEND[method]}; {UNSELECTED}; {remedy}"
            )
            self.report(call, message, severity=Severity.INFO)
            return
        does = "gathers the model's shards under FSDP and DeepSpeed" if what == "sharded" else "is a collective"
        message = (
            f"`{helper}()` reaches `{reached}()` ({place}), which {does}, but only the main process calls it here "
            f"(the main-process guard at line {line}): the other ranks never join and the job hangs; {remedy}"
        )
        self.report(call, message)

    # -- the other side: a collective only the other ranks reach -----------------------------

    def _others_only_collectives(self) -> None:
        """A collective in the branch that leaves the main process out (the ``else:`` of ``if
        accelerator.is_main_process:``, ``if not accelerator.is_main_process:``, ``if rank != 0:``) that the main
        process never makes in the same top-level function: the other ranks wait in it forever. The rank-0-first idiom
        (``if rank != 0: dist.barrier()`` ... ``if rank == 0: dist.barrier()``) and a root collective made on
        both sides are joined, and not reported."""
        for call, branch in others_only_collectives(self.facts):
            callee = get_full_name_for_node(call.func) or "this call"
            message = (
                f"`{callee}()` is a collective, but the main process never reaches it (the branch at line "
                f"{self.context.span(branch).line} leaves it out, and it makes no such call elsewhere in this "
                "function): the other ranks wait in it forever; call it on every rank, outside the rank test"
            )
            self.report(call, message)

    # -- what the project says of the backend -------------------------------------------------

    def _fsdp_evidence(self) -> str | None:
        return sharding.fsdp_evidence(self.facts, self.context.settings, self._line)

    def _line(self, node: cst.CSTNode) -> int:
        return self.context.span(node).line

    # -- the report -------------------------------------------------------------------------

    def _report(
        self,
        call: cst.Call,
        what: str,
        guard: cst.CSTNode,
        via: cst.Call | None,
        either: bool,
        anchors: list[cst.CSTNode],
        orderings: dict[int, Ordering],
    ) -> None:
        facts, line = self.facts, self.context.span(guard).line
        callee = get_full_name_for_node(call.func) or "this call"
        method = facts.method_name(call)
        where = f"the main-process guard at line {line}"
        if via is not None:
            helper = get_full_name_for_node(via.func) or "a helper"
            where = f"`{helper}()` called under {where}, line {self.context.span(via).line}"
        severity = None
        tail = ""
        sharded = sharding.needs_every_rank(facts, self.context.settings, what, method)
        if what == "sharded" and method == "save_state":
            does = (
                "is a collective under FSDP and under DeepSpeed at every ZeRO stage (the engine's `save_checkpoint`), "
                "and under any backend with `automatic_checkpoint_naming` (it calls `wait_for_everyone()`)"
            )
            if sharded or either:
                tail = "; every rank also writes its own RNG state (`random_states_<i>.pkl`) there"
            remedy = (
                "call it on every rank (it writes the model and optimizer files on the main process only) and keep "
                "only the rank-0 file work (checkpoint rotation, logging, uploads) under the guard"
            )
        elif what == "sharded":
            does = "gathers the model's shards under FSDP and DeepSpeed ZeRO-3"
            remedy = SAVE_MODEL_REMEDY if method == "save_model" else ALL_RANKS_PATTERN
        else:
            does = "is a collective"
            remedy = "call it on every rank and keep only the file writes and logging under the guard"
        # nothing in the project selects a backend under which it hangs: say what it costs under each
        conditional = not sharded and not either
        if conditional:
            possible = self._fsdp_evidence()
            severity = Severity.WARNING if possible else Severity.INFO
            does = f"{_BY_BACKEND[method]}; " + (
                f"{possible}, so it is meant to run under FSDP" if possible else UNSELECTED
            )
        does += tail
        if either and what == "sharded":
            evidence = self._fsdp_evidence()
            if evidence is not None:
                does = f"gathers the model's shards under FSDP ({evidence})" + tail
                where = f"the guard at line {line} lets every rank in under DeepSpeed, not under FSDP"
            else:
                does = "waits for every rank (`automatic_checkpoint_naming` calls `wait_for_everyone()`)" + tail
                where = f"the guard at line {line} lets every rank in under DeepSpeed only"
            certain = (
                sharding.launch_backend(self.context.settings) == "FSDP"
                or sharding.builds_fsdp_plugin(facts)
                or evidence is None
            )
            severity = Severity.ERROR if certain else Severity.WARNING
        elif either:
            where = (
                f"the guard at line {line} lets every rank in under DeepSpeed only: under DDP, FSDP or any other "
                "backend only the main process reaches it"
            )
        fix, why_not = self._fix(guard, anchors, orderings)
        receiver = call.func.value if isinstance(call.func, cst.Attribute) else None
        identified = facts.identified(receiver, call, "accelerator") if receiver is not None else None
        basis = f" ({identified})" if identified else ""
        if conditional:
            message = f"`{callee}()`{basis} runs only on the main process ({where}): it {does}; {remedy}"
        else:
            message = (
                f"`{callee}()`{basis} {does}, but only the main process reaches it ({where}): the other ranks never "
                f"join and the job hangs; {remedy}"
            )
        if why_not:
            message += f" (no automatic fix: {why_not})"
        self.report(call, message, severity=severity, fix=fix)

    # -- the fix ----------------------------------------------------------------------------

    def _fix(
        self, guard: cst.CSTNode, anchors: list[cst.CSTNode], orderings: dict[int, Ordering]
    ) -> tuple[Fix | None, str]:
        """The fix that calls the collectives (``anchors``: them, or the helper calls that reach them) on every
        rank, or why none is offered."""
        try:
            outer, statements = split_guard(self.facts, guard, anchors, orderings)
        except NoHoist as reason:
            return None, str(reason)
        fix = Fix(
            Applicability.UNSAFE,
            "Call the collective on every rank; keep the rank-0 work under the guard",
            replacements=((outer, cst.FlattenSentinel(statements)),),
        )
        return fix, ""
