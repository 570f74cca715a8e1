"""LD405 collective-in-rank-guard: a collective call that only the main process reaches, so the job hangs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.edits import replace_nodes
from lintdist.facts import (
    ACCELERATOR_CLASSES,
    MAIN_FLAGS,
    MAIN_ONLY_DECORATORS,
    MAX_CALLER_DEPTH,
    RANK_GETTERS,
    RANK_NAMES,
    argument_of,
    barrier_unsafe,
)
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Pattern, Rule, Valid, words

ACCELERATE_OBJECTS = ACCELERATOR_CLASSES | {"accelerate.PartialState", "accelerate.state.PartialState"}
# Accelerator methods every process must call, whatever the backend.
ACCELERATOR_COLLECTIVES = frozenset(
    {"gather", "gather_for_metrics", "reduce", "pad_across_processes", "wait_for_everyone", "check_trigger"}
)
# Collective under FSDP and DeepSpeed ZeRO-3 (they gather the shards); local under DDP.
ACCELERATOR_SHARD_GATHERS = frozenset({"save_state", "save_model", "get_state_dict"})
# Method names specific enough to accelerate to trust an unresolved receiver in an accelerate script.
ACCELERATE_ONLY_METHODS = frozenset(
    {"gather_for_metrics", "pad_across_processes", "wait_for_everyone", "check_trigger"}
)
TORCH_COLLECTIVES = frozenset(
    f"torch.distributed.{name}"
    for name in (
        "barrier",
        "monitored_barrier",
        "all_reduce",
        "all_gather",
        "all_gather_object",
        "all_gather_into_tensor",
        "broadcast",
        "broadcast_object_list",
        "gather",
        "gather_object",
        "scatter",
        "scatter_object_list",
        "reduce",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "all_to_all",
        "all_to_all_single",
        "new_group",
    )
)
CHECKPOINT_COLLECTIVES = frozenset(
    {
        "torch.distributed.checkpoint.save",
        "torch.distributed.checkpoint.load",
        "torch.distributed.checkpoint.save_state_dict",
        "torch.distributed.checkpoint.load_state_dict",
        "torch.distributed.checkpoint.state_dict_saver.save",
        "torch.distributed.checkpoint.state_dict_loader.load",
    }
    | {
        f"torch.distributed.checkpoint.state_dict.{name}"
        for name in ("get_model_state_dict", "get_optimizer_state_dict", "get_state_dict", "set_model_state_dict")
    }
    | {
        f"torch.distributed.fsdp.{module}FullyShardedDataParallel.{name}"
        for module in ("", "fully_sharded_data_parallel.")
        for name in ("optim_state_dict", "full_optim_state_dict", "sharded_optim_state_dict")
    }
)
# accelerate's module-level collectives (`from accelerate.utils import gather_object`), defined in
# `accelerate/utils/operations.py` in 1.15.
ACCELERATE_FUNCTIONS = frozenset(
    f"accelerate.utils.{module}{name}"
    for module in ("", "operations.")
    for name in ("gather", "gather_object", "broadcast", "broadcast_object_list", "reduce", "pad_across_processes")
)
BARRIERS = frozenset({"torch.distributed.barrier", "torch.distributed.monitored_barrier"})
# The last name of every call `_collective` can accept, spelled as it is called.
COLLECTIVE_NAMES = frozenset(
    {name.rsplit(".", 1)[-1] for name in TORCH_COLLECTIVES | CHECKPOINT_COLLECTIVES}
    | ACCELERATOR_COLLECTIVES
    | ACCELERATOR_SHARD_GATHERS
    | {"save_checkpoint", "state_dict"}
)
# Words one of which a module's text holds if a function of it can reach a collective `_collective` knows
# (`dcp.save` is imported from a module named `checkpoint`): another module with none is not parsed.
COLLECTIVE_MARKERS = tuple(
    sorted(
        {name.rsplit(".", 1)[-1] for name in TORCH_COLLECTIVES}
        | ACCELERATOR_COLLECTIVES
        | ACCELERATOR_SHARD_GATHERS
        | {"save_checkpoint", "state_dict", "checkpoint"}
    )
)
GATHERING_STATE_DICT_TYPES = frozenset({"FULL_STATE_DICT", "SHARDED_STATE_DICT"})
SHARDED_BACKENDS = frozenset({"FSDP", "DEEPSPEED"})
SHARDED_PLUGINS = frozenset(
    {
        "accelerate.FullyShardedDataParallelPlugin",
        "accelerate.utils.FullyShardedDataParallelPlugin",
        "accelerate.utils.dataclasses.FullyShardedDataParallelPlugin",
        "accelerate.DeepSpeedPlugin",
        "accelerate.utils.DeepSpeedPlugin",
        "accelerate.utils.dataclasses.DeepSpeedPlugin",
    }
)
FSDP_PLUGINS = frozenset(p for p in SHARDED_PLUGINS if "FullyShardedDataParallel" in p)
PROJECT_CONFIGURATIONS = frozenset(
    {"accelerate.utils.ProjectConfiguration", "accelerate.utils.dataclasses.ProjectConfiguration"}
)
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


RANK_TEST = Pattern(
    ("rank",),
    re.compile(r"(?m)rank\w*\s*(?:[=!<>]=|[<>%]|in\b|not\s+in\b|:\s*$|and\b|or\b)"),
)


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
    fix_kind = "unsafe"
    triggers = ("distributed", "accelerat", "deepspeed")
    # a main-process guard, and a collective
    also_triggers = (
        # a main-process guard the facts recognise (a rank, a main-process flag or decorator) ...
        (
            words(*(RANK_NAMES - {"rank"}), *RANK_GETTERS, *MAIN_FLAGS, *MAIN_ONLY_DECORATORS, "RANK", "LOCAL_RANK"),
            # a bare `rank` only where something tests it (`rank == 0`, `rank % n == 0`, `if not rank:`): the
            # word alone is in every low-rank adapter and tensor-parallel module of a library tree
            RANK_TEST,
        ),
        # ... and a collective
        (
            words(
                *(name.rsplit(".", 1)[-1] for name in TORCH_COLLECTIVES),
                *ACCELERATOR_COLLECTIVES,
                *ACCELERATOR_SHARD_GATHERS,
                # `state_dict()` is one only inside `state_dict_type(...)`
                *("checkpoint", "save_checkpoint", "state_dict_type", "optim_state_dict"),
                *("full_optim_state_dict", "sharded_optim_state_dict"),
            ),
        ),
    )

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
            what = self._collective(call)
            if what is None:
                continue
            hit = self._main_only(call, 0)
            either = False
            if hit is None:
                guard = self._deepspeed_or_main(call)
                if guard is None:
                    continue
                hit, either = (guard, None), True
            guard, via = hit
            if self._joined_by_others(via or call):
                continue
            found.setdefault(id(guard), []).append((call, what, guard, via, either))
        for call, guard, collective, helper in self._helpers_elsewhere():
            if id(guard) not in found:
                self._report_elsewhere(call, collective, helper, guard)
        self._others_only_collectives()
        order = facts.index.order
        for group in found.values():
            # one finding per guarded block, at the first collective it reaches
            group.sort(key=lambda item: (order(item[3] or item[0]), order(item[0])))
            call, what, guard, via, either = group[0]
            if either and not self._either_applies(call, what):
                continue
            anchors: list[cst.CSTNode] = []
            syncs: dict[int, _Sync] = {}
            for item in group:
                anchor = item[3] or item[0]
                if all(anchor is not a for a in anchors):
                    anchors.append(anchor)
                    syncs[id(anchor)] = self._sync(item[0], item[3], item[2])
            self._report(call, what, guard, via, either, anchors, syncs)

    # -- collectives in the project's other modules -------------------------------------------

    def _helpers_elsewhere(self) -> list[tuple[cst.Call, cst.CSTNode, tuple[cst.Call, str], Rule]]:
        """Calls under a main-process guard of functions defined in the project's other modules that reach a
        collective there (the first one), with the guard and this rule asked of that module. The guard is
        found first: only a guarded call's module is read."""
        facts = self.facts
        if facts.project is None:
            return []
        found = []
        for call in facts.calls:
            if not facts.imported_root(call.func) or facts.local_functions(call):
                continue
            names = sorted(q for q in facts.qualified_names(call.func) if facts.project.of_project(q))
            hit = self._main_only(call, 0) if names else None
            if hit is None:
                continue
            for qualified in names:
                definition = facts.project.definition(qualified, COLLECTIVE_MARKERS)
                if definition is None or not isinstance(definition[1], cst.FunctionDef):
                    continue
                other, helper = definition
                there = self.elsewhere(other)
                collective = next(
                    (
                        (inner, what)
                        for inner in other.reachable_calls(helper)
                        if (what := there._collective(inner)) is not None and not there._never_with_main(inner)
                    ),
                    None,
                )
                if collective is not None:
                    found.append((call, hit[0], collective, there))
                    break
        return found

    def _report_elsewhere(self, call: cst.Call, collective: tuple[cst.Call, str], there: Rule, guard) -> None:
        inner, what = collective
        helper = get_full_name_for_node(call.func) or "this helper"
        reached = get_full_name_for_node(inner.func) or "a collective"
        place = f"{there.context.path.name}:{there.context.span(inner).line}"
        line = self.context.span(guard).line
        remedy = (
            "call the helper on every rank and keep only the file writes and logging under the guard "
            "(no automatic fix: the collective is in another module)"
        )
        method = there.facts.method_name(inner)
        waits = method == "save_state" and self._automatic_naming
        if what == "sharded" and not (self._sharded_backend() or waits):
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

    # -- what is a collective ---------------------------------------------------------------

    def _collective(self, call: cst.Call) -> str | None:
        """ "always" or "sharded" (collective only under FSDP/DeepSpeed) for a collective call, else None."""
        facts = self.facts
        func = call.func
        last = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
        if last not in COLLECTIVE_NAMES and not (isinstance(func, cst.Name) and last in facts.imported_names):
            return None  # no collective's name, nor an alias an import binds (`from ... import all_reduce as ar`)
        names = facts.qualified_names(func)
        if names & (TORCH_COLLECTIVES | CHECKPOINT_COLLECTIVES | ACCELERATE_FUNCTIONS):
            if _on_sub_group(call) or _is_true(argument_of(call, "no_dist", None)):
                return None
            return "always"
        if not isinstance(call.func, cst.Attribute):
            return None
        method = call.func.attr.value
        receiver = call.func.value
        if method in ACCELERATOR_COLLECTIVES | ACCELERATOR_SHARD_GATHERS and self._is_accelerate_object(
            receiver, call, method
        ):
            return "sharded" if method in ACCELERATOR_SHARD_GATHERS else "always"
        if method == "save_checkpoint" and self._is_deepspeed_engine(receiver, call):
            return "always"
        if method == "state_dict" and not call.args and self._under_gathering_state_dict_type(call):
            return "always"
        return None

    def _is_accelerate_object(self, receiver: cst.BaseExpression, at: cst.CSTNode, method: str) -> bool:
        facts = self.facts
        origins = facts.origins(receiver, at)
        if any(isinstance(o.node, cst.Call) and facts.callee_is(o.node, ACCELERATE_OBJECTS) for o in origins):
            return True
        # a fragment or a helper that never names accelerate: `accelerator` is known by what is done with it
        if facts.identified(receiver, at, "accelerator") is not None:
            return True
        # `self.accelerator` set outside this file, or a parameter of a function called from elsewhere
        if not self._uses_accelerate():
            return False
        name = (get_full_name_for_node(receiver) or "").rsplit(".", 1)[-1]
        return method in ACCELERATE_ONLY_METHODS or "accelerator" in name

    def _uses_accelerate(self) -> bool:
        return any(module.split(".")[0] == "accelerate" for module in self.facts.imported_modules)

    def _is_deepspeed_engine(self, receiver: cst.BaseExpression, at: cst.CSTNode) -> bool:
        facts = self.facts
        return any(
            isinstance(o.node, cst.Call)
            and o.index in (None, 0)
            and "deepspeed.initialize" in facts.qualified_names(o.node.func)
            for o in facts.origins(receiver, at)
        )

    def _under_gathering_state_dict_type(self, call: cst.Call) -> bool:
        """Inside ``with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT ...)`` (or SHARDED)."""
        for ancestor in self.facts.ancestors(call):
            if isinstance(ancestor, cst.With):
                for item in ancestor.items:
                    context = item.item
                    if (
                        isinstance(context, cst.Call)
                        and self.facts.method_name(context) == "state_dict_type"
                        and any(_mentions(self.facts, arg.value, GATHERING_STATE_DICT_TYPES) for arg in context.args)
                    ):
                        return True
        return False

    # -- where it runs ----------------------------------------------------------------------

    def _main_only(self, node: cst.CSTNode, depth: int) -> tuple[cst.CSTNode, cst.Call | None] | None:
        """The guard that keeps ``node`` on the main process, and the helper call it passes through."""
        facts = self.facts
        if self._never_with_main(node):
            return None
        guard = facts.rank_guard(node)
        if guard is not None:
            return guard, None
        function = facts.enclosing_function(node)
        if function is None or depth >= MAX_CALLER_DEPTH:
            return None
        for site in facts.call_sites(function):
            found = self._main_only(site, depth + 1)
            if found is not None:
                return found[0], found[1] or site
        return None

    def _others_only_collectives(self) -> None:
        """A collective in the branch that leaves the main process out (the ``else:`` of ``if
        accelerator.is_main_process:``, ``if not accelerator.is_main_process:``, ``if rank != 0:``) that the main
        process never makes in the same top-level function: the other ranks wait in it forever. The rank-0-first idiom
        (``if rank != 0: dist.barrier()`` ... ``if rank == 0: dist.barrier()``) and a root collective made on
        both sides are joined, and not reported."""
        facts = self.facts
        reported: set[int] = set()
        for call in facts.calls:
            if self._collective(call) != "always":
                continue
            branch = self._others_branch(call)
            if branch is None or id(branch) in reported:
                continue
            if self._main_joins(call):
                continue
            reported.add(id(branch))
            callee = get_full_name_for_node(call.func) or "this call"
            message = (
                f"`{callee}()` is a collective, but the main process never reaches it (the branch at line "
                f"{self.context.span(branch).line} leaves it out, and it makes no such call elsewhere in this "
                "function): the other ranks wait in it forever; call it on every rank, outside the rank test"
            )
            self.report(call, message)

    def _others_branch(self, node: cst.CSTNode) -> cst.If | None:
        """The ``if`` whose branch around ``node`` (in its function) only the ranks other than the main one take."""
        facts = self.facts
        child = node
        for ancestor in facts.ancestors(node):
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                return None
            if isinstance(ancestor, cst.If) and (
                (child is ancestor.body and facts.excludes_main(ancestor.test, True))
                or (child is ancestor.orelse and facts.excludes_main(ancestor.test, False))
            ):
                return ancestor
            child = ancestor
        return None

    def _main_joins(self, call: cst.Call) -> bool:
        """The main process may make the same collective in the same top-level function, nested functions included
        (outside any branch that leaves it out): the rank-0-first pair, a root collective on both sides of the rank
        test, or the main side's call in a closure (transformers' optuna search broadcasts from one)."""
        key = self._call_key(call)
        scope = self._outermost_function(call)
        return any(
            other is not call
            and self._call_key(other) == key
            and self._outermost_function(other) is scope
            and self._others_branch(other) is None
            for other in self.facts.calls
        )

    def _outermost_function(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        function = self.facts.enclosing_function(node)
        while function is not None and (outer := self.facts.enclosing_function(function)) is not None:
            function = outer
        return function

    def _never_with_main(self, node: cst.CSTNode) -> bool:
        """``node`` sits, within its function, in a branch that excludes the main process (``if rank != 0:``) or
        runs only without distribution (``if local_rank == -1:``), so a main-only caller never reaches it there."""
        facts = self.facts
        child = node
        for ancestor in facts.ancestors(node):
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                return False
            if isinstance(ancestor, cst.If):
                if child is ancestor.body and (
                    facts.excludes_main(ancestor.test, True) or _single_process(ancestor.test)
                ):
                    return True
                if child is ancestor.orelse and facts.excludes_main(ancestor.test, False):
                    return True
            child = ancestor
        return False

    def _joined_by_others(self, call: cst.Call) -> bool:
        """The other ranks make the same call in a branch of the same function that excludes the main process:
        the barrier of ``if rank != 0:`` closing the rank-0-first idiom, or ``dist.gather(t, out, dst=0)`` under
        ``if rank == 0:`` with ``dist.gather(t, dst=0)`` under its ``else:`` (or after ``if rank != 0: ...; return``)."""
        facts = self.facts
        key = self._call_key(call)
        scope = facts.enclosing_function(call)
        return any(
            other is not call
            and facts.enclosing_function(other) is scope
            and self._call_key(other) == key
            and self._others_branch(other) is not None
            # the other ranks' side must be reachable by them: under an outer main-process guard it is dead code
            # (microsoft/Oscar's `if local_rank not in [-1, 0]: barrier()` inside `if local_rank in [-1, 0] and ...:`)
            and facts.rank_guard(other) is None
            for other in facts.calls
        )

    def _call_key(self, call: cst.Call) -> str | None:
        """What makes two calls the same collective: every barrier spelling is one, otherwise the callee's name."""
        return "barrier" if self._is_barrier(call) else self.facts.method_name(call)

    def _is_barrier(self, call: cst.Call) -> bool:
        if self.facts.callee_is(call, BARRIERS):
            return True
        return isinstance(call.func, cst.Attribute) and call.func.attr.value == "wait_for_everyone"

    def _deepspeed_or_main(self, call: cst.Call) -> cst.If | None:
        """``if accelerator.distributed_type == DistributedType.DEEPSPEED or accelerator.is_main_process:`` (either
        order) around ``call`` in its function: every rank enters it under DeepSpeed, only the main process under
        FSDP, DDP or any other backend."""
        facts = self.facts
        child = call
        for ancestor in facts.ancestors(call):
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                return None
            if isinstance(ancestor, cst.If) and child is ancestor.body:
                operands = _or_operands(ancestor.test)
                mains = [o for o in operands if facts.main_when(o, True)]
                if len(operands) > 1 and mains and all(o in mains or _is_deepspeed_test(o) for o in operands):
                    return ancestor
            child = ancestor
        return None

    def _either_applies(self, call: cst.Call, what: str) -> bool:
        """Under a DeepSpeed-or-main guard: silent when the launch selects DeepSpeed (every rank enters). A plain
        collective hangs under any other backend. `save_state`/`save_model`/`get_state_dict` gather only under FSDP
        there (DDP saves locally): reported only where the project says FSDP, or, for `save_state`, where
        automatic checkpoint naming makes it wait for every rank."""
        backend = self._backend()
        if backend == "DEEPSPEED":
            return False
        if what != "sharded":
            return True
        if backend is not None and backend != "FSDP" and not self._waits_for_everyone(call):
            return False
        return self._fsdp_evidence() is not None or self._waits_for_everyone(call)

    def _fsdp_evidence(self) -> str | None:
        """What in the project says FSDP: the launch settings, an FSDP plugin built here, or a test of
        ``DistributedType.FSDP`` in the script (it expects to run under FSDP)."""
        if self._backend() == "FSDP":
            return "the launch settings select FSDP"
        if self._fsdp_in_code():
            return "the script builds an FSDP plugin"
        facts = self.facts
        for node in facts.index.nodes(cst.Attribute):
            if node.attr.value == "FSDP" and any(
                name.endswith("DistributedType.FSDP") for name in facts.qualified_names(node)
            ):
                return f"the script tests `DistributedType.FSDP` at line {self.context.span(node).line}"
        return None

    def _waits_for_everyone(self, call: cst.Call) -> bool:
        """``save_state`` of an Accelerator built with ``ProjectConfiguration(automatic_checkpoint_naming=True)``:
        accelerate 1.15 calls ``wait_for_everyone()`` inside it whatever the backend."""
        return self.facts.method_name(call) == "save_state" and self._automatic_naming

    @cached_property
    def _automatic_naming(self) -> bool:
        """The file builds a ``ProjectConfiguration`` with automatic checkpoint naming (read once per file)."""
        facts = self.facts
        return any(
            facts.callee_is(call, PROJECT_CONFIGURATIONS)
            and (naming := argument_of(call, "automatic_checkpoint_naming", None)) is not None
            and get_full_name_for_node(naming) != "False"
            for call in facts.calls
        )

    # -- the report -------------------------------------------------------------------------

    def _report(
        self,
        call: cst.Call,
        what: str,
        guard: cst.CSTNode,
        via: cst.Call | None,
        either: bool,
        anchors: list[cst.CSTNode],
        syncs: dict[int, _Sync],
    ) -> None:
        callee = get_full_name_for_node(call.func) or "this call"
        method = self.facts.method_name(call)
        where = f"the main-process guard at line {self.context.span(guard).line}"
        if via is not None:
            helper = get_full_name_for_node(via.func) or "a helper"
            where = f"`{helper}()` called under {where}, line {self.context.span(via).line}"
        severity = None
        tail = ""
        if what == "sharded" and method == "save_state":
            does = (
                "is a collective under FSDP and under DeepSpeed at every ZeRO stage (the engine's `save_checkpoint`), "
                "and under any backend with `automatic_checkpoint_naming` (it calls `wait_for_everyone()`)"
            )
            # with automatic checkpoint naming it waits for every rank whatever the backend
            sharded = self._sharded_backend() or self._waits_for_everyone(call)
            if sharded or either:
                tail = "; every rank also writes its own RNG state (`random_states_<i>.pkl`) there"
            remedy = (
                "call it on every rank (it writes the model and optimizer files on the main process only) and keep "
                "only the rank-0 file work (checkpoint rotation, logging, uploads) under the guard"
            )
        elif what == "sharded":
            does = "gathers the model's shards under FSDP and DeepSpeed ZeRO-3"
            sharded = self._sharded_backend()
            remedy = SAVE_MODEL_REMEDY if method == "save_model" else ALL_RANKS_PATTERN
        else:
            does, sharded = "is a collective", True
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
        if either:
            line = self.context.span(guard).line
            if what == "sharded":
                evidence = self._fsdp_evidence()
                if evidence is not None:
                    does = f"gathers the model's shards under FSDP ({evidence})" + tail
                    where = f"the guard at line {line} lets every rank in under DeepSpeed, not under FSDP"
                else:
                    does = "waits for every rank (`automatic_checkpoint_naming` calls `wait_for_everyone()`)" + tail
                    where = f"the guard at line {line} lets every rank in under DeepSpeed only"
                certain = self._backend() == "FSDP" or self._fsdp_in_code() or evidence is None
                severity = Severity.ERROR if certain else Severity.WARNING
            else:
                where = (
                    f"the guard at line {line} lets every rank in under DeepSpeed only: under DDP, FSDP or any other "
                    "backend only the main process reaches it"
                )
                severity = None
        fix = None
        helpers = [a for a in anchors if not self._collective_at(a)]  # calls of helpers that reach a collective
        why_not = next((reason for site in helpers if (reason := self._unsafe_helper(site))), "")
        if not why_not and not isinstance(guard, cst.If):
            why_not = "the guard is an early `return` or a decorator"
        elif not why_not:
            outer, inner = self._outermost_guard(guard)
            try:
                statements, _ = _Hoist(self.facts, outer, anchors, inner, syncs).fix()
            except _NoFix as reason:
                why_not = str(reason)
            else:
                reach = self.facts.all_ranks_reach(outer)
                if reach.value is True:
                    fix = Fix(
                        Applicability.UNSAFE,
                        "Call the collective on every rank; keep the rank-0 work under the guard",
                        replacements=((outer, cst.FlattenSentinel(statements)),),
                    )
                else:
                    why_not = barrier_unsafe(reach)
        basis = ""
        if isinstance(call.func, cst.Attribute):
            identified = self.facts.identified(call.func.value, call, "accelerator")
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

    def _sync(self, call: cst.Call, via: cst.Call | None, guard: cst.CSTNode) -> _Sync:
        """How the collective ``call`` (reached through the helper call ``via``, if any) is ordered against the
        rank-0 work before it once it leaves the guard: a barrier orders that work itself; ``save_state`` and
        ``save_model`` create the folder and write files on every rank, so they need a barrier first, called on the
        Accelerator as the code at the guard spells it; the other collectives write nothing on the other ranks."""
        if self._is_barrier(call):
            return _Sync(barrier=True)
        if self.facts.method_name(call) not in FOLDER_WRITERS or not isinstance(call.func, cst.Attribute):
            return _Sync()
        if via is None:
            return _Sync(writes=True, owner=call.func.value)
        # an Accelerator as the code at the call names it: an argument of the helper, or the guard's own
        # (`if accelerator.is_main_process:`), both in scope there
        facts = self.facts
        test = guard.test if isinstance(guard, cst.If) else None
        tested = [a.value for a in facts.within(test, cst.Attribute) if a.attr.value in MAIN_FLAGS] if test else []
        owners = [arg.value for arg in via.args] + tested
        return _Sync(writes=True, owner=next((o for o in owners if facts.accelerator_like(o, via)), None))

    def _outermost_guard(self, guard: cst.If) -> tuple[cst.If, list[cst.If]]:
        """The outermost main-only ``if`` around ``guard`` in its function (``if sync and accelerator.is_main_process:``
        around ``if step % k == 0:`` around ``if accelerator.is_main_process:``), and the guards inside it; the fix
        splits the outermost one and folds the inner ones into the copies of its guard."""
        facts = self.facts
        chain = [guard]
        child: cst.CSTNode = guard
        for ancestor in facts.ancestors(guard):
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                break
            if (
                isinstance(ancestor, cst.If)
                and child is ancestor.body
                and (facts.main_when(ancestor.test, True) or _split_conjuncts(facts, ancestor.test)[0])
            ):
                chain.append(ancestor)
            child = ancestor
        return chain[-1], chain[:-1]

    def _collective_at(self, anchor: cst.CSTNode) -> bool:
        return isinstance(anchor, cst.Call) and self._collective(anchor) is not None

    def _unsafe_helper(self, site: cst.CSTNode) -> str:
        """Why the helper called at ``site`` (under the guard) may not run on every rank, or "" when it may: a
        local function called directly whose body only sets names from pure values, calls collectives, logs
        through a logger or ``accelerator.print``, and returns nothing. Anything else (a file write,
        ``save_pretrained``, a call lintdist cannot read) would then run on every rank."""
        facts = self.facts
        functions = facts.local_functions(site) if isinstance(site, cst.Call) else []
        if len(functions) != 1:
            return "the collective sits in a helper called through another helper"
        body = functions[0].body
        if not isinstance(body, cst.IndentedBlock) or functions[0].asynchronous is not None:
            return "the collective sits in a helper that cannot be read"
        for statement in body.body:
            if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
                return "the collective sits in a helper that also does other work"
            small = statement.body[0]
            if isinstance(small, cst.Pass) or (isinstance(small, cst.Return) and small.value is None):
                continue
            if isinstance(small, cst.Expr) and isinstance(small.value, (cst.SimpleString, cst.ConcatenatedString)):
                continue  # docstring
            if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
                inner = small.value
                if (self._collective(inner) is not None or self._logs(inner)) and all(
                    _is_pure(facts, c) for c in facts.within(inner, cst.Call) if c is not inner
                ):
                    continue
            if (
                isinstance(small, cst.Assign)
                and all(isinstance(t.target, cst.Name) for t in small.targets)
                and all(_is_pure(facts, c) for c in facts.within(small.value, cst.Call))
            ):
                continue
            return "the collective sits in a helper that also writes files"
        return ""

    def _logs(self, call: cst.Call) -> bool:
        """``logger.info(...)`` (accelerate's logger logs on the main process only by default) or
        ``accelerator.print(...)`` (the main process prints)."""
        func = call.func
        if not isinstance(func, cst.Attribute):
            return False
        if func.attr.value == "print":
            return self.facts.accelerator_like(func.value, call)
        return (
            func.attr.value in LOG_METHODS
            and isinstance(func.value, cst.Name)
            and func.value.value in {"logger", "logging", "log", "LOGGER"}
        )

    def _backend(self) -> str | None:
        settings = self.context.settings
        backend = settings.distributed_type if settings is not None else None
        return str(backend.value).upper() if backend is not None else None

    def _fsdp_in_code(self) -> bool:
        return self._plugin_in_code(FSDP_PLUGINS, ("fsdp_plugin",))

    def _sharded_backend(self) -> bool:
        return self._backend() in SHARDED_BACKENDS or self._plugin_in_code(
            SHARDED_PLUGINS, ("fsdp_plugin", "deepspeed_plugin")
        )

    def _plugin_in_code(self, plugins: frozenset[str], keywords: tuple[str, ...]) -> bool:
        """The script builds one of ``plugins``, or passes one of ``keywords`` to an ``Accelerator``."""
        facts = self.facts
        return any(
            facts.callee_is(call, plugins)
            or (
                facts.callee_is(call, ACCELERATOR_CLASSES)
                and any(argument_of(call, k, None) is not None for k in keywords)
            )
            for call in facts.calls
        )


def _or_operands(test: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.Or):
        return [*_or_operands(test.left), *_or_operands(test.right)]
    return [test]


def _is_deepspeed_test(test: cst.BaseExpression) -> bool:
    """``<x>.distributed_type == DistributedType.DEEPSPEED`` (or ``is``)."""
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    target = test.comparisons[0]
    if not isinstance(target.operator, (cst.Equal, cst.Is)):
        return False
    left = (get_full_name_for_node(test.left) or "").rsplit(".", 1)[-1]
    right = (get_full_name_for_node(target.comparator) or "").rsplit(".", 1)[-1]
    return {left, right} == {"distributed_type", "DEEPSPEED"}


def _single_process(test: cst.BaseExpression) -> bool:
    """``local_rank == -1`` or ``world_size == 1`` (alone or as a conjunct): the branch of a run without peers."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return _single_process(test.left) or _single_process(test.right)
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    target = test.comparisons[0]
    if not isinstance(target.operator, cst.Equal):
        return False
    name = (get_full_name_for_node(test.left) or "").rsplit(".", 1)[-1]
    value = cst.Module([]).code_for_node(target.comparator)
    return (name in RANK_NAMES and value == "-1") or (name == "world_size" and value == "1")


def _on_sub_group(call: cst.Call) -> bool:
    """An explicit process group other than ``None``/``WORLD``: members may all sit under the guard."""
    for keyword in ("group", "process_group"):
        value = argument_of(call, keyword, None)
        if value is None:
            continue
        name = get_full_name_for_node(value) or ""
        if name not in {"None"} and not name.endswith("WORLD"):
            return True
    return False


def _is_true(value: cst.BaseExpression | None) -> bool:
    return isinstance(value, cst.Name) and value.value == "True"


def _mentions(facts, expr: cst.BaseExpression, names: frozenset[str]) -> bool:
    return any(node.value in names for node in facts.within(expr, cst.Name))


# -- the fix: call the collective on every rank, keep the rank-0 work guarded ---------------------------------

# Calls that read nothing per rank and write nothing: they may run on every rank (argument set-up, conditions).
PURE_FUNCTIONS = frozenset(
    {f"os.path.{name}" for name in ("join", "basename", "dirname", "splitext", "abspath", "expanduser")}
    | {"pathlib.Path", "pathlib.PurePath"}
)
PURE_BUILTINS = frozenset(
    {"str", "int", "float", "bool", "len", "isinstance", "min", "max", "abs", "round", "tuple", "list", "repr"}
)
PURE_METHODS = frozenset({"unwrap_model", "format", "join"})
LOG_METHODS = frozenset({"debug", "info", "warning", "warn"})
# Names whose value differs between ranks, or that make per-rank data: a condition or set-up that reads one is not
# hoisted.
PER_RANK_NAMES = (
    RANK_NAMES
    | RANK_GETTERS
    | MAIN_FLAGS
    | frozenset({"RANK", "LOCAL_RANK", "is_last_process", "local_main_process_first", "main_process_first", "device"})
)
PER_RANK_METHODS = frozenset({"item", "tolist", "cpu", "detach", "numpy", "mean", "sum", "compute", "backward"})
# Accelerator methods that create the target folder and write files on every rank (`random_states_<i>.pkl`, the
# shards): rank-0 work before them (checkpoint rotation) must end before the other ranks start them.
FOLDER_WRITERS = frozenset({"save_state", "save_model"})
# Collectives that return a value, so that a call nested in a larger statement can be bound to a name first.
VALUE_COLLECTIVES = frozenset({"get_state_dict", "gather", "gather_for_metrics", "reduce", "pad_across_processes"})
_ESCAPES = (cst.Return, cst.Break, cst.Continue)


@dataclass(frozen=True)
class _Sync:
    """How a collective that leaves the guard is ordered against the rank-0 work that stays guarded before it."""

    barrier: bool = False  # it is a barrier: that work ends before any rank passes it
    writes: bool = False  # it writes on every rank (`save_state`): a barrier must come first
    owner: cst.BaseExpression | None = None  # the Accelerator that barrier is called on (None: none in sight)


class _NoFix(Exception):
    """Why the guarded block cannot be split (the message names it)."""


class _Hoist:
    """Rewrites ``if <main>: ...`` so that the collectives in it run on every rank.

    A statement of the guarded block that holds a collective either is the call itself (``accelerator.save_state(p)``
    or ``sd = accelerator.get_state_dict(m)``): it leaves the guard; or holds it as an argument
    (``m.save_pretrained(d, state_dict=accelerator.get_state_dict(m))``): the call is bound to a new name on every rank
    and the statement stays guarded; or is an ``if`` whose condition reads no rank: the ``if`` leaves the guard and its
    blocks are split the same way. The statements that set up the call's arguments (``save_path = ...``) leave with
    it; every other statement stays under a copy of the guard's test, in its place, so the main process runs the
    same statements in the same order as before. A call that writes on every rank (``save_state``) and follows
    rank-0 work that stays guarded (checkpoint rotation) gets a barrier just before it: without one the other ranks
    would create the new folder while the main process may still be listing the old ones to delete them."""

    def __init__(
        self,
        facts,
        guard: cst.If,
        anchors: list[cst.CSTNode],
        inner: list[cst.If] = (),
        syncs: dict[int, _Sync] | None = None,
    ) -> None:
        self.facts = facts
        self.guard = guard
        self.anchors = anchors
        self.syncs = syncs or {}  # by anchor: how its collective is ordered against the rank-0 work before it
        self.copies: list[cst.If] = []  # the copies of the guard, around the statements that stay guarded
        self.ordered: dict[int, _Sync] = {}  # the lines that leave the guard whole, by their anchor's `_Sync`
        self.inner = list(inner)  # main-process guards inside ``guard``: their statements join its copies
        self.function = facts.enclosing_function(guard)
        self.scope = self.function if self.function is not None else facts.index.module
        self.bound: set[str] = set()  # names the statements leaving the guard bind
        self.taken: set[str] = set()
        self.header_used = False

    def fix(self) -> tuple[list[cst.BaseStatement], set[str]]:
        guard, facts = self.guard, self.facts
        if guard.orelse is not None:
            raise _NoFix("the guard has an `else` branch")
        if not isinstance(guard.body, cst.IndentedBlock) or not isinstance(
            facts.parent(guard), (cst.IndentedBlock, cst.Module)
        ):
            raise _NoFix("the guard is not a plain `if` block")
        if any(line.comment is not None for line in guard.body.footer):
            raise _NoFix("a comment closes the guarded block")
        if facts.rank_guard(guard) is not None or self._outer_guard(guard):
            raise _NoFix("the guard sits inside another main-process guard")
        mains, rest = _split_conjuncts(facts, guard.test)
        if not mains:
            self.test = guard.test
        else:
            # `if accelerator.is_main_process and step % k == 0:`: the step test wraps the split block
            for part in rest:
                self._check_uniform(part, "condition")
            self.test = _conjunction(mains)
        statements, needed = self._split(list(guard.body.body), set())
        statements, _ = self._barriers(statements, False)
        if rest:
            needed |= set().union(*(self._reads(part) for part in rest))
            header = cst.TrailingWhitespace() if self.header_used else guard.body.header
            self.header_used = True
            statements = [
                cst.If(
                    test=_conjunction(rest),
                    body=cst.IndentedBlock(body=statements, header=header),
                )
            ]
        if not self.header_used and guard.body.header.comment is not None:
            raise _NoFix("the guard's comment would have no place")
        self._check_available(needed)
        self._check_bound_names()
        first = statements[0]
        statements[0] = first.with_changes(leading_lines=(*guard.leading_lines, *first.leading_lines))
        return statements, needed

    def _outer_guard(self, guard: cst.If) -> bool:
        """Another main-only ``if`` (or the DeepSpeed-or-main form) encloses ``guard`` in its function."""
        facts = self.facts
        child: cst.CSTNode = guard
        for ancestor in facts.ancestors(guard):
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                return False
            if (
                isinstance(ancestor, cst.If)
                and child is ancestor.body
                and any(facts.main_when(o, True) for o in [*_or_operands(ancestor.test), ancestor.test])
            ):
                return True
            child = ancestor
        return False

    # -- splitting blocks ---------------------------------------------------------------------

    def _holds_anchor(self, node: cst.CSTNode) -> bool:
        return any(a is node or self.facts.is_within(a, node) for a in self.anchors)

    def _split(self, statements: list[cst.BaseStatement], needed: set[str]) -> tuple[list[cst.BaseStatement], set]:
        """The statements of one block, with the collectives out of the guard; ``needed``: the names the statements
        after this block read on every rank (in), and those this block's statements read on every rank (out)."""
        items: list[tuple[bool, cst.BaseStatement]] = []  # (on every rank, statement), in reverse
        for statement in reversed(self._unfold(statements)):
            if self._holds_anchor(statement):
                if isinstance(statement, cst.SimpleStatementLine):
                    shared, kept, needed = self._split_line(statement, needed)
                    if kept is not None:
                        items.append((False, kept))
                    items.extend((True, s) for s in reversed(shared))
                elif isinstance(statement, cst.If):
                    new, needed = self._split_if(statement, needed)
                    items.append((True, new))
                else:
                    raise _NoFix(f"the call sits in a `{_keyword(statement)}` block under the guard")
                continue
            bound = self._bound(statement)
            if bound & needed:
                needed = self._setup(statement, bound, needed)
                items.append((True, statement))
                continue
            if items and items[-1][0] and bound and self._movable(statement, bound):
                # a pure assignment just before the shared code leaves with it rather than split the guard
                needed = self._setup(statement, bound, needed)
                items.append((True, statement))
                continue
            self._check_stays(statement)
            items.append((False, statement))
        items.reverse()
        out: list[cst.BaseStatement] = []
        run: list[cst.BaseStatement] = []
        for shared, statement in items:
            if shared:
                if run:
                    out.append(self._guarded(run))
                    run = []
                out.append(statement)
            else:
                run.append(statement)
        if run:
            out.append(self._guarded(run))
        return out, needed

    def _unfold(self, statements: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
        """An inner main-process guard testing what the outer one tests is replaced by its statements: on the main
        process they run as before, and the ones that stay guarded go under a copy of the outer guard."""
        out: list[cst.BaseStatement] = []
        code = cst.Module([]).code_for_node
        for statement in statements:
            if not any(statement is guard for guard in self.inner):
                out.append(statement)
                continue
            if statement.orelse is not None or not isinstance(statement.body, cst.IndentedBlock):
                raise _NoFix("the inner main-process guard has an `else` branch")
            if statement.body.header.comment is not None or any(line.comment for line in statement.body.footer):
                raise _NoFix("a comment on the inner main-process guard would have no place")
            if code(statement.test) != code(self.test):
                raise _NoFix("the inner guard tests another process than the outer one")
            body = list(statement.body.body)
            body[0] = body[0].with_changes(leading_lines=(*statement.leading_lines, *body[0].leading_lines))
            out.extend(self._unfold(body))
        return out

    def _split_if(self, statement: cst.If, needed: set[str]) -> tuple[cst.If, set[str]]:
        self._check_uniform(statement.test, "condition")
        body, inner = self._split(list(_block(statement.body)), set(needed))
        orelse = statement.orelse
        other = set(needed)
        if isinstance(orelse, cst.If):
            orelse, other = self._split_if(orelse, set(needed))
        elif isinstance(orelse, cst.Else):
            else_body, other = self._split(list(_block(orelse.body)), set(needed))
            orelse = orelse.with_changes(body=orelse.body.with_changes(body=else_body))
        new = statement.with_changes(body=statement.body.with_changes(body=body), orelse=orelse)
        return new, inner | other | self._reads(statement.test)

    def _split_line(
        self, line: cst.SimpleStatementLine, needed: set[str]
    ) -> tuple[list[cst.SimpleStatementLine], cst.SimpleStatementLine | None, set[str]]:
        """A line with a collective: it leaves the guard, or its collectives are bound to names on every rank first."""
        if len(line.body) != 1:
            raise _NoFix("the call shares its line with other statements")
        small = line.body[0]
        anchors = [a for a in self.anchors if a is small or self.facts.is_within(a, small)]
        whole = (isinstance(small, cst.Expr) and small.value in anchors) or (
            isinstance(small, cst.Assign)
            and small.value in anchors
            and all(isinstance(t.target, cst.Name) for t in small.targets)
        )
        if whole:
            self._check_call(small.value if isinstance(small, (cst.Expr, cst.Assign)) else small)
            if id(small.value) in self.syncs:
                self.ordered[id(line)] = self.syncs[id(small.value)]
            bound = self._bound(line)
            self.bound |= bound
            return [line], None, (needed - bound) | self._reads(line)
        shared: list[cst.SimpleStatementLine] = []
        swaps: list[tuple[cst.CSTNode, cst.Name]] = []
        reads: set[str] = set()
        for anchor in anchors:
            if not isinstance(anchor, cst.Call) or self.facts.method_name(anchor) not in VALUE_COLLECTIVES:
                raise _NoFix("the call is part of a larger statement")
            self._check_extractable(anchor, small)
            self._check_call(anchor)
            name = self._new_name(anchor)
            self.bound.add(name)
            shared.append(
                cst.SimpleStatementLine(body=[cst.Assign(targets=[cst.AssignTarget(cst.Name(name))], value=anchor)])
            )
            swaps.append((anchor, cst.Name(name)))
            reads |= self._reads(anchor)
        # in one pass: `deep_replace` copies the line, so a second anchor would no longer be found in it
        kept = replace_nodes(line, swaps)
        if shared:
            shared[0] = shared[0].with_changes(leading_lines=line.leading_lines)
            kept = kept.with_changes(leading_lines=())
        return shared, kept, needed | reads

    def _guarded(self, run: list[cst.BaseStatement]) -> cst.If:
        """The statements of ``run`` under a copy of the guard (its comments stay in place)."""
        first = run[0]
        header = self.guard.body.header
        if self.header_used:
            header = cst.TrailingWhitespace()
        self.header_used = True
        copy = self.guard.with_changes(
            test=self.test.deep_clone(),
            body=self.guard.body.with_changes(
                header=header, body=[first.with_changes(leading_lines=()), *run[1:]], footer=()
            ),
            leading_lines=first.leading_lines,
        )
        self.copies.append(copy)
        return copy

    def _barriers(self, statements: list[cst.BaseStatement], after_work: bool) -> tuple[list, bool]:
        """``statements`` with a barrier before each line that writes on every rank and that rank-0 work (a copy of
        the guard) may precede on some path, ``after_work`` saying whether some did before them; and whether some
        may still precede what follows them."""
        out: list[cst.BaseStatement] = []
        for statement in statements:
            sync = self.ordered.get(id(statement))
            if any(statement is copy for copy in self.copies):
                after_work = True
            elif isinstance(statement, cst.If):
                statement, after_work = self._if_barriers(statement, after_work)
            elif sync is not None and sync.barrier:
                after_work = False
            elif sync is not None and sync.writes and after_work:
                if sync.owner is None:
                    raise _NoFix(
                        "rank-0 work comes before the call, and no Accelerator is in sight at the helper's call to "
                        "make the other ranks wait for it"
                    )
                wait = cst.Call(cst.Attribute(value=sync.owner.deep_clone(), attr=cst.Name("wait_for_everyone")))
                out.append(cst.SimpleStatementLine(body=[cst.Expr(wait)], leading_lines=statement.leading_lines))
                statement = statement.with_changes(leading_lines=())
                after_work = False
            out.append(statement)
        return out, after_work

    def _if_barriers(self, statement: cst.If, after_work: bool) -> tuple[cst.If, bool]:
        body, after_body = self._barriers(list(statement.body.body), after_work)
        orelse, after_other = statement.orelse, after_work
        if isinstance(orelse, cst.If):
            orelse, after_other = self._if_barriers(orelse, after_work)
        elif isinstance(orelse, cst.Else):
            else_body, after_other = self._barriers(list(orelse.body.body), after_work)
            orelse = orelse.with_changes(body=orelse.body.with_changes(body=else_body))
        new = statement.with_changes(body=statement.body.with_changes(body=body), orelse=orelse)
        return new, after_body or after_other

    # -- checks -----------------------------------------------------------------------------

    def _setup(self, statement: cst.BaseStatement, bound: set[str], needed: set[str], dry: bool = False) -> set[str]:
        """A statement that sets up what the call reads: it must run on every rank, so it must be a plain
        assignment of a value every rank computes alike, with no side effect."""
        names = ", ".join(f"`{n}`" for n in sorted(bound & needed))
        if not (
            isinstance(statement, cst.SimpleStatementLine)
            and len(statement.body) == 1
            and isinstance(statement.body[0], (cst.Assign, cst.AnnAssign))
            and statement.body[0].value is not None
            and all(isinstance(t.target, cst.Name) for t in getattr(statement.body[0], "targets", ()))
        ):
            raise _NoFix(f"{names}, which the call reads, is set by rank-0 code that cannot leave the guard")
        self._check_uniform(statement.body[0].value, f"set-up of {names}")
        if dry:
            return needed
        self.bound |= bound
        return (needed - bound) | self._reads(statement)

    def _movable(self, statement: cst.BaseStatement, bound: set[str]) -> bool:
        try:
            self._setup(statement, bound, set(), dry=True)
        except _NoFix:
            return False
        if self._read_outside(bound):
            return False
        return not self.facts.within(statement, cst.Call) or all(
            self._pure(c) for c in self.facts.within(statement, cst.Call)
        )

    def _check_stays(self, statement: cst.BaseStatement) -> None:
        """A statement that stays guarded must not leave the block early on the main process only."""
        for node in self.facts.within(statement, *_ESCAPES):
            if isinstance(node, cst.Return) or not any(
                isinstance(a, (cst.For, cst.While)) and self.facts.is_within(a, statement)
                for a in self.facts.ancestors(node)
            ):
                raise _NoFix("the rank-0 code under the guard can leave the block early (`return`/`break`)")

    def _check_call(self, call: cst.CSTNode) -> None:
        args = call.args if isinstance(call, cst.Call) else ()
        for arg in args:
            self._check_uniform(arg.value, "argument of the call")

    def _check_uniform(self, expr: cst.BaseExpression, what: str, depth: int = 0) -> None:
        """``expr`` has the same value on every rank as far as lintdist can tell: it reads no rank and no per-rank
        value, and calls nothing but pure helpers."""
        facts = self.facts
        for string in facts.within(expr, cst.SimpleString):
            if "RANK" in string.value:
                raise _NoFix(f"the {what} reads the rank")
        for call in facts.within(expr, cst.Call):
            if not self._pure(call):
                callee = get_full_name_for_node(call.func) or "a call"
                raise _NoFix(f"the {what} calls `{callee}()`, which may differ between ranks")
        for name in facts.within(expr, cst.Name):
            if name.value in PER_RANK_NAMES:
                raise _NoFix(f"the {what} reads the rank (`{name.value}`)")
        for name in self._read_names(expr):
            if depth >= 2:
                continue
            for binding in facts.bindings(name.value, expr):
                if self.facts.is_within(binding.statement, self.guard):
                    continue  # checked where it stands
                if any(facts.method_name(c) in PER_RANK_METHODS for c in facts.within(binding.value, cst.Call)):
                    raise _NoFix(f"the {what} reads `{name.value}`, a per-rank value")
                for inner in facts.within(binding.value, cst.Name):
                    if inner.value in PER_RANK_NAMES:
                        raise _NoFix(f"the {what} reads `{name.value}`, which derives from the rank")

    def _pure(self, call: cst.Call) -> bool:
        return _is_pure(self.facts, call)

    def _check_extractable(self, call: cst.Call, small: cst.BaseSmallStatement) -> None:
        """``call`` can be evaluated before the rest of its statement: it is not inside a lambda, a comprehension or
        a conditional expression, and whatever the statement evaluates before it is pure."""
        facts = self.facts
        for ancestor in facts.ancestors(call):
            if ancestor is small:
                break
            if isinstance(
                ancestor,
                (
                    cst.Lambda,
                    cst.IfExp,
                    cst.BooleanOperation,
                    cst.ListComp,
                    cst.SetComp,
                    cst.DictComp,
                    cst.GeneratorExp,
                ),
            ):
                raise _NoFix("the call is evaluated conditionally inside its statement")
        order = facts.index.order(call)
        for other in facts.within(small, cst.Call):
            if facts.index.order(other) < order and not facts.is_within(call, other) and not self._pure(other):
                raise _NoFix("the statement calls other code before the collective")

    def _check_available(self, needed: set[str]) -> None:
        """What the moved statements read is set on every rank before the guard."""
        facts = self.facts
        for name in sorted(needed):
            for binding in facts.bindings(name, self.guard):
                if facts.is_within(binding.statement, self.guard):
                    continue
                if facts.rank_guard(binding.statement) is not None:
                    raise _NoFix(f"`{name}`, which the call reads, is set only on the main process")

    def _check_bound_names(self) -> None:
        """The names the moved statements bind are read nowhere else: on the other ranks they would now hold a
        value where they held none (or an older one)."""
        for name in self._read_outside(self.bound):
            raise _NoFix(f"`{name.value}`, set under the guard, is also read outside it")

    def _read_outside(self, names: set[str]) -> list[cst.Name]:
        facts = self.facts
        return [
            name
            for name in self._read_names(self.scope)
            if name.value in names and not facts.is_within(name, self.guard) and not self._set_before(name)
        ]

    def _set_before(self, name: cst.Name) -> bool:
        """An assignment of ``name`` runs before this read on every path: an earlier statement of a block that
        holds the read (``save_path = ...; save_progress(save_path)``), outside the guard."""
        facts = self.facts
        child: cst.CSTNode = name
        for ancestor in facts.ancestors(name):
            if isinstance(ancestor, (cst.IndentedBlock, cst.Module)):
                for statement in ancestor.body:
                    if statement is child:
                        break
                    if (
                        isinstance(statement, cst.SimpleStatementLine)
                        and statement is not self.guard
                        and any(
                            isinstance(small, cst.Assign) and any(_is_name(t.target, name.value) for t in small.targets)
                            for small in statement.body
                        )
                    ):
                        return True
            if ancestor is self.scope:
                return False
            child = ancestor
        return False

    def _new_name(self, call: cst.Call) -> str:
        first = call.args[0].value if call.args else None
        while isinstance(first, cst.Call):  # `get_state_dict(accelerator.unwrap_model(model))`: name it after `model`
            first = first.args[0].value if first.args else None
        stem = get_full_name_for_node(first) if first is not None else None
        stem = stem.rsplit(".", 1)[-1] if stem else ""
        suffix = "state_dict" if self.facts.method_name(call) == "get_state_dict" else "gathered"
        used = {n.value for n in self.facts.within(self.scope, cst.Name)} | self.taken
        for candidate in (f"{stem}_{suffix}" if stem else suffix, f"{stem}_{suffix}_all" if stem else f"{suffix}_all"):
            if candidate.isidentifier() and candidate not in used:
                self.taken.add(candidate)
                return candidate
        raise _NoFix("no free name for the collective's result")

    # -- names ------------------------------------------------------------------------------

    def _read_names(self, node: cst.CSTNode) -> list[cst.Name]:
        """The names ``node`` reads: not attribute names, keywords or assignment targets."""
        facts = self.facts
        skip: set[int] = set()
        for attribute in facts.within(node, cst.Attribute):
            skip.add(id(attribute.attr))
        for arg in facts.within(node, cst.Arg):
            if arg.keyword is not None:
                skip.add(id(arg.keyword))
        for target in facts.within(node, cst.AssignTarget):
            if isinstance(target.target, cst.Name):
                skip.add(id(target.target))
        return [n for n in facts.within(node, cst.Name) if id(n) not in skip]

    def _reads(self, node: cst.CSTNode) -> set[str]:
        return {n.value for n in self._read_names(node)}

    def _bound(self, statement: cst.CSTNode) -> set[str]:
        """The names a statement binds (assignments, loop and ``with`` targets, walrus), at any depth."""
        facts = self.facts
        names: set[str] = set()
        targets: list[cst.CSTNode] = []
        for node in facts.within(statement, cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For, cst.AsName):
            if isinstance(node, cst.AsName):
                targets.append(node.name)
            elif isinstance(node, cst.AssignTarget):
                targets.append(node.target)
            else:
                targets.append(node.target)
        for node in facts.within(statement, cst.NamedExpr):
            targets.append(node.target)
        for target in targets:
            names |= {n.value for n in facts.within(target, cst.Name)}
        return names


def _is_pure(facts, call: cst.Call) -> bool:
    """A call with no side effect whose value is the same on every rank given the same arguments."""
    if (
        isinstance(call.func, cst.Name)
        and call.func.value in PURE_BUILTINS
        and not facts.bindings(call.func.value, call)
    ):
        return True
    if facts.qualified_names(call.func) & PURE_FUNCTIONS:
        return True
    method = facts.method_name(call)
    if method == "unwrap_model":
        return True
    if method in PURE_METHODS and isinstance(call.func, cst.Attribute):
        return isinstance(call.func.value, (cst.SimpleString, cst.ConcatenatedString))
    return False


def _block(body: cst.BaseSuite) -> tuple[cst.BaseStatement, ...]:
    if not isinstance(body, cst.IndentedBlock):
        raise _NoFix("a one-line `if` holds the call")
    return tuple(body.body)


def _keyword(statement: cst.CSTNode) -> str:
    return {cst.For: "for", cst.While: "while", cst.With: "with", cst.Try: "try"}.get(type(statement), "compound")


def _split_conjuncts(facts, test: cst.BaseExpression) -> tuple[list, list]:
    """The conjuncts of ``test`` that imply the main process, and the others (none split off for a single test)."""
    if not (isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And)):
        return [], []
    parts: list[cst.BaseExpression] = []
    pending = [test]
    while pending:
        node = pending.pop()
        if isinstance(node, cst.BooleanOperation) and isinstance(node.operator, cst.And) and not node.lpar:
            pending.extend((node.right, node.left))
        else:
            parts.append(node)
    mains = [p for p in parts if facts.main_when(p, True)]
    return mains, [p for p in parts if all(p is not m for m in mains)]


def _conjunction(parts: list[cst.BaseExpression]) -> cst.BaseExpression:
    code = cst.Module([]).code_for_node
    try:
        return cst.parse_expression(" and ".join(code(p) for p in parts))
    except cst.ParserSyntaxError as error:
        raise _NoFix("the guard's condition cannot be split") from error


def _is_name(node: cst.CSTNode, value: str) -> bool:
    return isinstance(node, cst.Name) and node.value == value
