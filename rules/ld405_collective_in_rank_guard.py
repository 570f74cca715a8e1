"""LD405 collective-in-rank-guard: a collective call that only the main process reaches, so the job hangs."""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import (
    ACCELERATOR_CLASSES,
    MAIN_FLAGS,
    MAIN_ONLY_DECORATORS,
    MAX_CALLER_DEPTH,
    RANK_GETTERS,
    RANK_NAMES,
    argument_of,
)
from lintdist.model import Severity
from lintdist.rule import Invalid, Rule, Valid, words

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
BARRIERS = frozenset({"torch.distributed.barrier", "torch.distributed.monitored_barrier"})
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
ALL_RANKS_PATTERN = (
    "call it on every rank, e.g. `sd = accelerator.get_state_dict(model)`, then save with "
    "`accelerator.unwrap_model(model).save_pretrained(d, is_main_process=accelerator.is_main_process, "
    "save_function=accelerator.save, state_dict=sd)`"
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
    `wait_for_everyone`, `check_trigger` (and `save_state`, `save_model`,
    `get_state_dict`, which gather shards under FSDP and DeepSpeed ZeRO-3),
    the `torch.distributed` collectives, `torch.distributed.checkpoint`
    `save`/`load` and its state-dict getters, FSDP `state_dict()` under a
    full or sharded `state_dict_type`, and a DeepSpeed engine's
    `save_checkpoint`. The report points at the collective call.

    ## Why is this bad?
    A collective completes only when every process of the group joins it.
    The other ranks skip the guarded block, so the main process waits
    forever (or until the backend's timeout), and the others hang at their
    next collective. The classic cases are saving an FSDP or ZeRO-3 model
    under `is_main_process` and a `gather` for logging on rank 0 only.
    `accelerator.save`, `torch.save`, `unwrap_model(model).state_dict()` and
    point-to-point `send`/`recv` are not collectives and are not reported;
    nor are collectives on an explicit sub-group (`group=`), collectives
    under `if world_size > 1:` or `if dist.is_initialized():`, or the
    `dist.barrier()` in `if rank == 0:` that closes the rank-0-first idiom
    (paired with a barrier under `if rank != 0:`), nor a root collective
    such as `dist.gather(t, out, dst=0)` whose `else:` branch (or the
    branch that excludes the main process) makes the same call.

    ## Example
    ```python
    if accelerator.is_main_process:
        state_dict = accelerator.get_state_dict(model)
        accelerator.save(state_dict, "model.pt")
    ```

    ## Use instead
    ```python
    state_dict = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        accelerator.save(state_dict, "model.pt")
    ```

    ## Fix safety
    There is no automatic fix: which part of the guarded block must move out
    of the guard depends on the script. `save_state`, `save_model` and
    `get_state_dict` are errors when the script or its launch configuration
    selects FSDP or DeepSpeed, warnings otherwise (they are local under DDP,
    but the script hangs once it is launched with a sharded backend).

    ## References
    - accelerate `Accelerator.get_state_dict`, `save_model` and `save_state`
      (FSDP and DeepSpeed paths gather the shards on every process)
    - accelerate issue #2000: `save_state` under `is_main_process` hangs with FSDP
    - `torch.distributed` collective communication documentation: "all
      processes in the group must call this function"
    """

    code = "LD405"
    name = "collective-in-rank-guard"
    severity = Severity.ERROR
    fix_kind = "none"
    triggers = ("distributed", "accelerat", "deepspeed")
    # a main-process guard, and a collective
    also_triggers = (
        # a main-process guard the facts recognise (a rank, a main-process flag or decorator) ...
        (words(*RANK_NAMES, *RANK_GETTERS, *MAIN_FLAGS, *MAIN_ONLY_DECORATORS, "RANK", "LOCAL_RANK"),),
        # ... and a collective
        (
            words(
                *(name.rsplit(".", 1)[-1] for name in TORCH_COLLECTIVES),
                *ACCELERATOR_COLLECTIVES,
                *ACCELERATOR_SHARD_GATHERS,
                *("checkpoint", "save_checkpoint", "state_dict", "optim_state_dict"),
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
    )
    INVALID = (
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
            lines=(8, 9),
        ),
    )

    def finish(self) -> None:
        facts = self.facts
        for call in facts.calls:
            what = self._collective(call)
            if what is None:
                continue
            found = self._main_only(call, 0)
            if found is None:
                continue
            guard, via = found
            if self._joined_by_others(via or call):
                continue
            self._report(call, what, guard, via)

    # -- what is a collective ---------------------------------------------------------------

    def _collective(self, call: cst.Call) -> str | None:
        """ "always" or "sharded" (collective only under FSDP/DeepSpeed) for a collective call, else None."""
        facts = self.facts
        names = facts.qualified_names(call.func)
        if names & (TORCH_COLLECTIVES | CHECKPOINT_COLLECTIVES):
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
        for other in facts.calls:
            if other is call or facts.enclosing_function(other) is not scope or self._call_key(other) != key:
                continue
            child = other
            for ancestor in facts.ancestors(other):
                if isinstance(ancestor, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                    break
                if isinstance(ancestor, cst.If) and (
                    (child is ancestor.body and facts.excludes_main(ancestor.test, True))
                    or (child is ancestor.orelse and facts.excludes_main(ancestor.test, False))
                ):
                    return True
                child = ancestor
        return False

    def _call_key(self, call: cst.Call) -> str | None:
        """What makes two calls the same collective: every barrier spelling is one, otherwise the callee's name."""
        return "barrier" if self._is_barrier(call) else self.facts.method_name(call)

    def _is_barrier(self, call: cst.Call) -> bool:
        if self.facts.callee_is(call, BARRIERS):
            return True
        return isinstance(call.func, cst.Attribute) and call.func.attr.value == "wait_for_everyone"

    # -- the report -------------------------------------------------------------------------

    def _report(self, call: cst.Call, what: str, guard: cst.CSTNode, via: cst.Call | None) -> None:
        callee = get_full_name_for_node(call.func) or "this call"
        where = f"the main-process guard at line {self.context.span(guard).line}"
        if via is not None:
            helper = get_full_name_for_node(via.func) or "a helper"
            where = f"`{helper}()` called under {where}, line {self.context.span(via).line}"
        severity = None
        if what == "sharded":
            does = "gathers the model's shards under FSDP and DeepSpeed ZeRO-3"
            if not self._sharded_backend():
                severity = Severity.WARNING
                does += " (it hangs once the script is launched with one of them)"
            remedy = ALL_RANKS_PATTERN
        else:
            does = "is a collective"
            remedy = "call it on every rank and keep only the file writes and logging under the guard"
        message = (
            f"`{callee}()` {does}, but only the main process reaches it ({where}): the other ranks never join "
            f"and the job hangs; {remedy}"
        )
        self.report(call, message, severity=severity)

    def _sharded_backend(self) -> bool:
        settings = self.context.settings
        backend = settings.distributed_type if settings is not None else None
        if backend is not None and str(backend.value).upper() in SHARDED_BACKENDS:
            return True
        facts = self.facts
        return any(
            facts.callee_is(call, SHARDED_PLUGINS)
            or (
                facts.callee_is(call, ACCELERATOR_CLASSES)
                and any(argument_of(call, k, None) is not None for k in ("fsdp_plugin", "deepspeed_plugin"))
            )
            for call in facts.calls
        )


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
