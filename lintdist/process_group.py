"""When a script starts its processes' shared state, and how code at a point names it.

Which framework a script (or the script calling a helper module) is distributed with; whether an ``Accelerator``,
``PartialState`` or ``init_process_group`` runs before a statement, after it, or at callers out of sight; which
expression names the accelerator (or accelerate state) where a statement is, and whether it may be None there; and
whether a ``PartialState()`` started at a statement would set up what the script's own ``Accelerator(...)`` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import ACCELERATOR_CLASSES, MAX_CALLER_DEPTH

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts

STATE_CLASSES = ACCELERATOR_CLASSES | {"accelerate.PartialState", "accelerate.state.PartialState"}
ACCELERATE_SCRIPT = STATE_CLASSES | {"accelerate.notebook_launcher", "accelerate.launchers.notebook_launcher"}
TORCH_SCRIPT = frozenset(
    {
        "torch.nn.parallel.DistributedDataParallel",
        "torch.multiprocessing.spawn",
        "torch.utils.data.DistributedSampler",
        "torch.utils.data.distributed.DistributedSampler",
        "deepspeed.initialize",
        "deepspeed.init_distributed",
    }
)
# Calls that create the default process group (DeepSpeed's create it when none exists).
INIT_PROCESS_GROUP = frozenset(
    {"torch.distributed.init_process_group", "deepspeed.initialize", "deepspeed.init_distributed"}
)
GROUP_STARTERS = INIT_PROCESS_GROUP | STATE_CLASSES
# Lightning runs `prepare_data` on one process per node and orders `setup` after it: its own scheme.
LIGHTNING_PACKAGES = ("lightning", "pytorch_lightning")
# `Accelerator(...)` keywords that do not reach `PartialState` (accelerate 1.15: `AcceleratorState` passes `cpu` and
# the process-group kwargs handlers to it, and a DeepSpeed plugin selects the backend through the environment).
STATE_NEUTRAL_KEYWORDS = frozenset(
    {"gradient_accumulation_steps", "gradient_accumulation_plugin", "mixed_precision", "log_with", "project_dir"}
    | {"project_config", "step_scheduler_with_optimizer", "split_batches", "dispatch_batches", "even_batches"}
    | {"rng_types", "device_placement"}
)


def script_framework(facts: PythonFacts) -> str | None:
    """Which framework this module's calls start processes with: "accelerate", "torch" (``torch.distributed``,
    DDP, ``mp.spawn``, DeepSpeed), or None (none, or a Lightning script)."""
    names = set().union(*(facts.qualified_names(call.func) for call in facts.calls))
    if names & ACCELERATE_SCRIPT:
        return "accelerate"
    if any(name.split(".")[0] in LIGHTNING_PACKAGES for name in names):
        return None
    if names & TORCH_SCRIPT or any(name.startswith("torch.distributed.") for name in names):
        return "torch"
    return None


def callers_framework(facts: PythonFacts, nodes: list[cst.CSTNode]) -> str | None:
    """The framework of the project's scripts that call the functions holding ``nodes`` (a helper module is
    distributed when the script calling it is), following local callers up a few levels."""
    for node in nodes:
        function = facts.enclosing_function(node)
        seen = 0
        while function is not None and seen <= MAX_CALLER_DEPTH:
            for site in facts.external_call_sites(function):
                framework = script_framework(site.facts)
                if framework is not None:
                    return framework
            sites = facts.call_sites(function)
            function = facts.enclosing_function(sites[0]) if sites else None
            seen += 1
    return None


def group_started_after(facts: PythonFacts, statement: cst.CSTNode) -> bool:
    """Whether the process group is started (``init_process_group``, an ``Accelerator``/``PartialState``) after
    ``statement`` in its own function (or module level)."""
    function = facts.enclosing_function(statement)
    end = facts.index.end(statement)
    return any(
        facts.index.order(call) >= end and facts.enclosing_function(call) is function for call in _starters(facts)
    )


def group_started_before(facts: PythonFacts, node: cst.CSTNode, depth: int = 0) -> bool | None:
    """Whether an ``Accelerator``/``PartialState`` or ``init_process_group`` runs before ``node``: earlier in its
    function (directly or in a local helper it calls), or before every call site of that function. None when the
    function has no call site in this file (its callers are unknown)."""
    function = facts.enclosing_function(node)
    order = facts.index.order(node)
    scope = function if function is not None else facts.index.module
    for call in facts.within(scope, cst.Call):
        if facts.index.order(call) >= order or facts.enclosing_function(call) is not function:
            continue
        if facts.callee_is(call, GROUP_STARTERS) or any(
            facts.callee_is(c, GROUP_STARTERS)
            for helper in facts.local_functions(call)
            for c in facts.reachable_calls(helper)
        ):
            return True
    if function is None:
        return False
    sites = facts.call_sites(function)
    if not sites or depth >= MAX_CALLER_DEPTH:
        return None
    answers = [group_started_before(facts, site, depth + 1) for site in sites]
    if all(answers):
        return True
    return False if False in answers else None


def state_can_start_at(facts: PythonFacts, statement: cst.CSTNode) -> bool:
    """Whether a ``PartialState()`` started at ``statement`` sets up what the script does itself: its
    ``Accelerator``/``PartialState`` is built later in this function, every one with only keywords that leave the
    process state alone (no ``cpu=``, ``kwargs_handlers``, DeepSpeed plugin), nothing else starts a group, and
    ``PartialState`` is free or imported from accelerate."""
    if not all(
        isinstance(b.node, cst.ImportFrom)
        and get_full_name_for_node(b.node.module) in {"accelerate", "accelerate.state"}
        for b in facts.names.module_bindings("PartialState")
    ):
        return False
    function = facts.enclosing_function(statement)
    starters = _starters(facts)
    later = [
        c
        for c in starters
        if facts.enclosing_function(c) is function and facts.index.order(c) > facts.index.order(statement)
    ]
    return bool(later) and all(
        facts.callee_is(c, STATE_CLASSES)
        and all(arg.keyword is not None and arg.keyword.value in STATE_NEUTRAL_KEYWORDS for arg in c.args)
        for c in starters
    )


def state_expression_at(facts: PythonFacts, statement: cst.CSTNode) -> tuple[str, bool] | None:
    """The script's own expression for its accelerator (or accelerate state) bound where ``statement`` runs (a
    parameter annotated or passed as one, a name or ``self.x`` assigned ``Accelerator(...)``, a closure variable),
    and whether it may be None there (``accelerator=None``, ``Accelerator() if cond else None``)."""
    function = facts.enclosing_function(statement)
    candidates: list[str] = []
    if function is not None:
        params = [*function.params.posonly_params, *function.params.params, *function.params.kwonly_params]
        candidates.extend(p.name.value for p in params)
    candidates.extend(_state_targets(facts))
    for key in dict.fromkeys(c for c in candidates if c):
        kinds = _state_origins(facts, key, statement)
        if "state" not in kinds:
            continue
        maybe_none = "none" in kinds
        bindings = facts.bindings(key, statement)
        parameter = facts.parameter(key, statement) if function is not None else None
        if not bindings and parameter is not None:
            return key, maybe_none or _none(parameter[2].default)
        if any(_bound_before(facts, b.statement, b.function, function, statement) for b in bindings):
            return key, maybe_none
    return None


def _starters(facts: PythonFacts) -> list[cst.Call]:
    if "group_starters" not in facts._memo:
        facts._memo["group_starters"] = [c for c in facts.calls if facts.callee_is(c, GROUP_STARTERS)]
    return facts._memo["group_starters"]


def _state_targets(facts: PythonFacts) -> list[str]:
    """The names the file binds an Accelerator or accelerate state to (``accelerator = Accelerator(...)``)."""
    found: list[str] = []
    for call in _starters(facts):
        if not facts.callee_is(call, STATE_CLASSES):
            continue
        assign = facts.parent(call)
        while isinstance(assign, cst.IfExp):  # `Accelerator(...) if cond else Accelerator()`
            assign = facts.parent(assign)
        if isinstance(assign, cst.Assign):
            found.extend(get_full_name_for_node(t.target) or "" for t in assign.targets)
        elif isinstance(assign, cst.AnnAssign):
            found.append(get_full_name_for_node(assign.target) or "")
    return found


def _state_origins(facts: PythonFacts, key: str, at: cst.CSTNode) -> set[str]:
    """What an accelerator expression can hold: "state" (an Accelerator or PartialState), "none", "other". A
    parameter annotated ``Accelerator`` counts as one; a name a nested function reads from its enclosing function is
    followed there."""
    kinds: set[str] = set()
    parameter = facts.parameter(key, at) if "." not in key else None
    annotation = parameter[2].annotation if parameter is not None else None
    if annotation is not None and not STATE_CLASSES.isdisjoint(facts.qualified_names(annotation.annotation)):
        kinds.add("state")
    pending = [(o, 0) for o in facts.origins(cst.parse_expression(key), at)]
    while pending:
        origin, depth = pending.pop()
        node = origin.node
        if isinstance(node, cst.Call) and facts.callee_is(node, STATE_CLASSES):
            kinds.add("state")
        elif _none(node):
            kinds.add("none")
        elif isinstance(node, cst.Name) and depth < MAX_CALLER_DEPTH:
            # a free variable of a nested function: its binding in the enclosing function
            inner = facts.enclosing_function(node)
            outer = facts.enclosing_function(inner) if inner is not None else None
            found = facts.bindings(node.value, inner) if outer is not None else []
            if not found:
                kinds.add("other")
            for binding in found:
                pending.extend((o, depth + 1) for o in facts.origins(binding.value, binding.statement))
        elif isinstance(node, cst.Param):
            kinds.add("none" if _none(node.default) else "other")
        else:
            kinds.add("other")
    return kinds


def _bound_before(facts: PythonFacts, bound_at: cst.CSTNode, bound_in, function, statement: cst.CSTNode) -> bool:
    """A binding is visible at ``statement``: earlier in the same function, or in another function or at module level
    when ``statement`` is inside a function (which runs later), unless that function is called before the binding."""
    order = facts.index.order
    if bound_in is function:
        return order(bound_at) < order(statement)
    if function is None:
        return False
    # `data = load()` above `accelerator = Accelerator()`: the function runs before the binding exists
    return not any(
        facts.enclosing_function(site) is bound_in and order(site) < order(bound_at)
        for site in facts.call_sites(function)
    )


def _none(node: cst.CSTNode | None) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"
