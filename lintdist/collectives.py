"""Which calls are collectives: operations every process of the group must join, or the job hangs.

A rule asks ``collective_kind`` of a call instead of keeping its own lists of ``torch.distributed``,
``torch.distributed.checkpoint``, accelerate and DeepSpeed names; ``same_collective`` says whether two calls join one
collective, and ``joined_by_others``/``main_joins`` whether the ranks on the other side of a rank test make it too.
The answers come from the facts' indexes (no walk of their own).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import ACCELERATOR_CLASSES, argument_of
from lintdist.main_process import never_with_main, others_branch, outermost_function
from lintdist.rule import words

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts

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
        *("barrier", "monitored_barrier", "all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor"),
        *("broadcast", "broadcast_object_list", "gather", "gather_object", "scatter", "scatter_object_list"),
        *("reduce", "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "new_group"),
    )
)
CHECKPOINT_COLLECTIVES = frozenset(
    {
        f"torch.distributed.checkpoint.{name}"
        for name in (
            *("save", "load", "save_state_dict", "load_state_dict"),
            *("state_dict_saver.save", "state_dict_loader.load"),
        )
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
# The last name of every call `collective_kind` can accept, spelled as it is called.
COLLECTIVE_NAMES = frozenset(
    {name.rsplit(".", 1)[-1] for name in TORCH_COLLECTIVES | CHECKPOINT_COLLECTIVES}
    | ACCELERATOR_COLLECTIVES
    | ACCELERATOR_SHARD_GATHERS
    | {"save_checkpoint", "state_dict"}
)
# Words one of which a module's text holds if a function of it can reach a collective `collective_kind` knows
# (`dcp.save` is imported from a module named `checkpoint`): pass them to `ProjectView.definition` as markers.
COLLECTIVE_MARKERS = tuple(
    sorted(
        {name.rsplit(".", 1)[-1] for name in TORCH_COLLECTIVES}
        | ACCELERATOR_COLLECTIVES
        | ACCELERATOR_SHARD_GATHERS
        | {"save_checkpoint", "state_dict", "checkpoint"}
    )
)
GATHERING_STATE_DICT_TYPES = frozenset({"FULL_STATE_DICT", "SHARDED_STATE_DICT"})


def collective_kind(facts: PythonFacts, call: cst.Call) -> str | None:
    """Whether ``call`` is a collective: "always", "sharded" (an Accelerator's ``save_state``, ``save_model`` or
    ``get_state_dict``: collective under FSDP/DeepSpeed), or None. A call on an explicit sub-group is none."""
    func = call.func
    last = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
    if last not in COLLECTIVE_NAMES and not (isinstance(func, cst.Name) and last in facts.imported_names):
        return None  # no collective's name, nor an alias an import binds (`from ... import all_reduce as ar`)
    if facts.qualified_names(func) & (TORCH_COLLECTIVES | CHECKPOINT_COLLECTIVES | ACCELERATE_FUNCTIONS):
        no_dist = argument_of(call, "no_dist", None)
        if on_sub_group(call) or (isinstance(no_dist, cst.Name) and no_dist.value == "True"):
            return None
        return "always"
    if not isinstance(func, cst.Attribute):
        return None
    method, receiver = func.attr.value, func.value
    if method in ACCELERATOR_COLLECTIVES | ACCELERATOR_SHARD_GATHERS and _accelerate_object(facts, receiver, call):
        return "sharded" if method in ACCELERATOR_SHARD_GATHERS else "always"
    if method == "save_checkpoint" and _deepspeed_engine(facts, receiver, call):
        return "always"
    if method == "state_dict" and not call.args and _under_gathering_state_dict_type(facts, call):
        return "always"
    return None


def is_barrier(facts: PythonFacts, call: cst.Call) -> bool:
    """``call`` is ``dist.barrier()``, ``dist.monitored_barrier()`` or a ``wait_for_everyone()``."""
    if facts.callee_is(call, BARRIERS):
        return True
    return isinstance(call.func, cst.Attribute) and call.func.attr.value == "wait_for_everyone"


def same_collective(facts: PythonFacts, a: cst.Call, b: cst.Call) -> bool:
    """``a`` and ``b`` join the same collective: barriers of any spelling, otherwise calls of the same name."""
    return _key(facts, a) == _key(facts, b)


def joined_by_others(facts: PythonFacts, call: cst.Call) -> bool:
    """The other ranks make the same collective as ``call`` in a branch of its function that leaves the main process
    out and that they reach: the barrier of ``if rank != 0:`` closing the rank-0-first idiom, or ``dist.gather(t,
    dst=0)`` under the ``else:`` of ``if rank == 0:`` (or after ``if rank != 0: ...; return``)."""
    scope = facts.enclosing_function(call)
    return any(
        other is not call
        and facts.enclosing_function(other) is scope
        and same_collective(facts, other, call)
        and others_branch(facts, other) is not None
        # the other ranks' side must be reachable by them: under an outer main-process guard it is dead code
        # (microsoft/Oscar's `if local_rank not in [-1, 0]: barrier()` inside `if local_rank in [-1, 0] and ...:`)
        and facts.rank_guard(other) is None
        for other in facts.calls
    )


def main_joins(facts: PythonFacts, call: cst.Call) -> bool:
    """The main process may make the same collective as ``call`` in the same top-level function, nested functions
    included, outside any branch that leaves it out: the rank-0-first pair, a root collective on both sides of the
    rank test, or the main side's call in a closure (transformers' optuna search broadcasts from one)."""
    scope = outermost_function(facts, call)
    return any(
        other is not call
        and same_collective(facts, other, call)
        and outermost_function(facts, other) is scope
        and others_branch(facts, other) is None
        for other in facts.calls
    )


def on_sub_group(call: cst.Call) -> bool:
    """``call`` names an explicit process group other than ``None``/``WORLD`` (``group=``, ``process_group=``)."""
    for keyword in ("group", "process_group"):
        value = argument_of(call, keyword, None)
        if value is None:
            continue
        name = get_full_name_for_node(value) or ""
        if name != "None" and not name.endswith("WORLD"):
            return True
    return False


def _key(facts: PythonFacts, call: cst.Call) -> str | None:
    return "barrier" if is_barrier(facts, call) else facts.method_name(call)


def _accelerate_object(facts: PythonFacts, receiver: cst.BaseExpression, at: cst.Call) -> bool:
    """``receiver`` holds an Accelerator or a ``PartialState``: made here, known by its API, or, in a script that
    imports accelerate, named like one or used with a method only accelerate has."""
    origins = facts.origins(receiver, at)
    if any(isinstance(o.node, cst.Call) and facts.callee_is(o.node, ACCELERATE_OBJECTS) for o in origins):
        return True
    if facts.identified(receiver, at, "accelerator") is not None:
        return True
    if not any(module.split(".")[0] == "accelerate" for module in facts.imported_modules):
        return False
    name = (get_full_name_for_node(receiver) or "").rsplit(".", 1)[-1]
    return at.func.attr.value in ACCELERATE_ONLY_METHODS or "accelerator" in name


def _deepspeed_engine(facts: PythonFacts, receiver: cst.BaseExpression, at: cst.CSTNode) -> bool:
    return any(
        isinstance(o.node, cst.Call)
        and o.index in (None, 0)
        and "deepspeed.initialize" in facts.qualified_names(o.node.func)
        for o in facts.origins(receiver, at)
    )


def _under_gathering_state_dict_type(facts: PythonFacts, call: cst.Call) -> bool:
    """Inside ``with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT ...)`` (or SHARDED)."""
    return any(
        isinstance(item.item, cst.Call)
        and facts.method_name(item.item) == "state_dict_type"
        and any(
            node.value in GATHERING_STATE_DICT_TYPES
            for arg in item.item.args
            for node in facts.within(arg.value, cst.Name)
        )
        for ancestor in facts.ancestors(call)
        if isinstance(ancestor, cst.With)
        for item in ancestor.items
    )


# Calls that make an expression collective under some backend (gathers, sharded state dicts, barriers), by name.
GATHERING_METHODS = frozenset(
    {"get_state_dict", "gather", "gather_for_metrics", "gather_object", "reduce", "all_gather", "all_reduce"}
    | {"broadcast", "full_optim_state_dict", "optim_state_dict", "sharded_optim_state_dict", "get_model_state_dict"}
    | {"get_optimizer_state_dict", "wait_for_everyone"}
)


def may_gather(facts: PythonFacts, expr: cst.CSTNode | None, sharded: bool) -> bool:
    """``expr`` calls something that is collective under some backend, by its name: a gather or reduction, a
    sharded state-dict getter, a barrier, or a ``state_dict()`` where the model is sharded (``sharded``, or an FSDP
    wrapper in this file). Such code must run on every rank."""
    if expr is None:
        return False
    for call in {id(c): c for c in [expr, *facts.within(expr, cst.Call)] if isinstance(c, cst.Call)}.values():
        name = facts.method_name(call) or (call.func.value if isinstance(call.func, cst.Name) else None)
        if name in GATHERING_METHODS:
            return True
        if name == "state_dict" and (sharded or _fsdp_wrapped(facts)):
            return True
    return False


def _fsdp_wrapped(facts: PythonFacts) -> bool:
    return any(
        any("FullyShardedDataParallel" in q or "fully_shard" in q for q in facts.qualified_names(call.func))
        for call in facts.wrapped_models()
    )


def collective_elsewhere(facts: PythonFacts, call: cst.Call) -> tuple[PythonFacts, cst.Call, str] | None:
    """The first collective that ``call``, a call of a function defined in another module of the project, reaches
    there outside the branches the main process never takes (``if rank != 0:``), with that module's facts and the
    collective's kind (``collective_kind``); None when it reaches none or the function is out of sight."""
    if facts.project is None or not facts.imported_root(call.func) or facts.local_functions(call):
        return None
    for qualified in sorted(facts.qualified_names(call.func)):
        definition = facts.project.definition(qualified, COLLECTIVE_MARKERS)
        if definition is None or not isinstance(definition[1], cst.FunctionDef):
            continue
        other, function = definition
        for inner in other.reachable_calls(function):
            kind = collective_kind(other, inner)
            if kind is not None and not never_with_main(other, inner):
                return other, inner, kind
    return None


def others_only_collectives(facts: PythonFacts) -> list[tuple[cst.Call, cst.If]]:
    """The collectives in a branch that leaves the main process out (the ``else:`` of ``if
    accelerator.is_main_process:``, ``if rank != 0:``) that the main process never makes in the same top-level
    function (``main_joins``), the first of each branch, with the branch's ``if``: the other ranks wait in them."""
    found: list[tuple[cst.Call, cst.If]] = []
    for call in facts.calls:
        branch = others_branch(facts, call) if collective_kind(facts, call) == "always" else None
        if branch is None or any(branch is b for _, b in found) or main_joins(facts, call):
            continue
        found.append((call, branch))
    return found


# A rule's trigger group (``Rule.also_triggers``) for a file that may make a collective ``collective_kind`` knows
# (`state_dict()` is one only inside `state_dict_type(...)`).
COLLECTIVE_TEXTS = (
    words(
        *(name.rsplit(".", 1)[-1] for name in TORCH_COLLECTIVES),
        *ACCELERATOR_COLLECTIVES,
        *ACCELERATOR_SHARD_GATHERS,
        *("checkpoint", "save_checkpoint", "state_dict_type", "optim_state_dict"),
        *("full_optim_state_dict", "sharded_optim_state_dict"),
    ),
)


# torch.distributed collectives that combine every rank's value into one result, with the position of the value
# each rank sends (`all_gather(out, value)`, `all_reduce(value)`).
COMBINING_COLLECTIVES = {
    f"torch.distributed.{name}": position
    for name, position in (
        ("all_reduce", 0),
        ("reduce", 0),
        ("all_gather", 1),
        ("all_gather_into_tensor", 1),
        ("all_gather_object", 1),
        ("gather", 0),
        ("gather_object", 0),
    )
}


def combined_value(facts: PythonFacts, call: cst.Call, depth: int = 0) -> cst.BaseExpression | None:
    """What ``call`` sends to be combined with the other ranks' values: the sent argument of a ``torch.distributed``
    collective that combines (``all_reduce``, ``all_gather``, ``gather``...), or what a call of the file's own helper
    passes for a parameter that the helper combines, itself or through a name made from it
    (``reduce_tensor(loss)`` of ``def reduce_tensor(t): rt = t.clone(); dist.all_reduce(rt)``). None otherwise."""
    positions = [COMBINING_COLLECTIVES[q] for q in facts.qualified_names(call.func) if q in COMBINING_COLLECTIVES]
    if positions:
        positional = [a for a in call.args if a.keyword is None and not a.star]
        return positional[positions[0]].value if len(positional) > positions[0] else None
    functions = facts.local_functions(call) if depth < 2 else []
    if len(functions) != 1:
        return None
    function = functions[0]
    params = [*function.params.posonly_params, *function.params.params]
    for inner in facts.calls_within(function):
        sent = combined_value(facts, inner, depth + 1) if inner is not call else None
        if sent is None:
            continue
        names = {n.value for n in facts.within(sent, cst.Name)}
        for name in list(names):  # `rt = t.clone()`: the name made from the parameter
            for binding in facts.bindings(name, inner):
                if binding.index is None and binding.value is not None and facts.is_within(binding.statement, function):
                    names |= {n.value for n in facts.within(binding.value, cst.Name)}
        for index, param in enumerate(params):
            if param.name.value in names:
                passed = facts.argument_for(call, function, param.name.value, index)
                if passed is not None:
                    return passed
    return None
