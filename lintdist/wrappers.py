"""How a model is wrapped for data parallelism (DDP, FSDP1, FSDP2), and which module a forward call runs.

A model expression is followed to the constructions it can hold (``facts.origins``): each is a wrapper call
of a known kind or something else ("unknown"). Rules ask for the kinds an expression can be, the wrapper
calls behind it, and the kinds of wrapper the module builds at all (or has built by a helper of another project
module, or is passed by its callers); which calls run a wrapped model's forward (or its inner ``.module``, past
the wrapper), and the run of statements from such a forward to a later node.
"""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.control import statement_of
from lintdist.facts import DDP_WRAPPERS, PythonFacts, argument_of
from lintdist.literals import is_name

FSDP1_CLASSES = frozenset(
    {
        "torch.distributed.fsdp.FullyShardedDataParallel",
        "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel",
    }
)
FSDP2_FUNCTIONS = frozenset(
    {
        "torch.distributed.fsdp.fully_shard",
        "torch.distributed._composable.fsdp.fully_shard",
        "torch.distributed.fsdp._fully_shard.fully_shard",
        "torch.distributed._composable.fsdp.fully_shard.fully_shard",
    }
)
WRAPPERS_BY_KIND = {"ddp": DDP_WRAPPERS, "fsdp1": FSDP1_CLASSES, "fsdp2": FSDP2_FUNCTIONS}


def forward_target(call: cst.Call) -> cst.BaseExpression:
    """The module a call runs the forward of: ``model`` for ``model(x)`` and ``model.forward(x)``."""
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value == "forward":
        return func.value
    return func


def forward_of(call: cst.Call, names: frozenset[str]) -> str | None:
    """The dotted name, among ``names``, of the module a call runs the forward of (``model(x)``,
    ``self.model.forward(x)``); None when it runs none of them."""
    name = get_full_name_for_node(forward_target(call))
    return name if name in names else None


def wrapper_kind(facts: PythonFacts, node: cst.CSTNode) -> str | None:
    """ "ddp", "fsdp1" or "fsdp2" for a wrapper call (``DistributedDataParallel(...)``,
    ``FullyShardedDataParallel(...)``, ``fully_shard(...)``); None for any other node."""
    if isinstance(node, cst.Call):
        for kind, names in WRAPPERS_BY_KIND.items():
            if facts.callee_is(node, names):
                return kind
    return None


def wrapper_calls(facts: PythonFacts, expr: cst.BaseExpression, at: cst.CSTNode, kind: str = "ddp") -> list[cst.Call]:
    """The wrapper calls of ``kind`` an expression can hold (empty: none known)."""
    return [o.node for o in facts.origins(expr, at) if wrapper_kind(facts, o.node) == kind]


def is_wrapped(facts: PythonFacts, expr: cst.BaseExpression, at: cst.CSTNode, kind: str = "ddp") -> bool:
    """Whether an expression can hold a model wrapped by a wrapper of ``kind``."""
    return bool(wrapper_calls(facts, expr, at, kind))


def wrapper_kinds(facts: PythonFacts, expr: cst.BaseExpression, at: cst.CSTNode) -> set[str]:
    """The kinds of wrapper an expression can hold, one per origin: "ddp", "fsdp1", "fsdp2", or "unknown"."""
    return {wrapper_kind(facts, o.node) or "unknown" for o in facts.origins(expr, at)}


def module_wrapper_kinds(facts: PythonFacts) -> set[str]:
    """The kinds of wrapper this module's own code builds ("ddp", "fsdp1", "fsdp2")."""
    return {kind for call in facts.wrapped_models() if (kind := wrapper_kind(facts, call)) is not None}


def never_shards(call: cst.Call, module: cst.Module) -> bool:
    """Whether an FSDP1 wrapper keeps whole gradients on every rank:
    ``FullyShardedDataParallel(..., sharding_strategy=ShardingStrategy.NO_SHARD)``."""
    strategy = argument_of(call, "sharding_strategy", 2)
    return strategy is not None and module.code_for_node(strategy).endswith("NO_SHARD")


def runs_wrapped(facts: PythonFacts, call: cst.Call, kind: str = "ddp") -> bool:
    """Whether a call runs the forward of a model wrapped by a wrapper of ``kind`` (``ddp(x)``,
    ``self.model.forward(x)``)."""
    target = forward_target(call)
    return isinstance(target, (cst.Name, cst.Attribute)) and is_wrapped(facts, target, call, kind)


def inner_module_forwards(facts: PythonFacts, node: cst.CSTNode, kind: str = "ddp") -> list[cst.Call]:
    """The calls ``node`` runs (also inside the local functions it calls) that run the forward of a wrapped model's
    inner ``.module`` (``ddp.module(x)``), past the wrapper of ``kind``."""
    return [
        call
        for call in facts.reachable_calls(node)
        if isinstance(target := forward_target(call), cst.Attribute)
        and target.attr.value == "module"
        and is_wrapped(facts, target.value, call, kind)
    ]


def forward_run(
    facts: PythonFacts, node: cst.CSTNode, kind: str = "ddp"
) -> tuple[list[cst.BaseStatement], cst.BaseExpression] | None:
    """The consecutive statements of one block from the first that runs the forward of a model wrapped by ``kind``
    to the one holding ``node`` (looking out through the ``with`` blocks around it), and the model as an expression
    of ``node``'s function: the forward's own target, or the wrapped model it passes to the helper that runs the
    forward. None when no forward comes first, the forwards are of two wrapped models (a GAN), or the model has no
    name there."""
    statement = statement_of(facts, node)
    function = facts.enclosing_function(node)
    while statement is not None:
        block = facts.parent(statement)
        if not isinstance(block, (cst.IndentedBlock, cst.Module)):
            return None
        body = list(block.body)
        statements = body[: body.index(statement) + 1]
        for index, first in enumerate(statements):
            forwards = [c for c in facts.reachable_calls(first) if runs_wrapped(facts, c, kind)]
            if forwards:
                run = statements[index:]
                model = _forward_model(facts, run, forwards, function, kind)
                return (run, model) if model is not None else None
        owner = facts.parent(block)
        if not isinstance(owner, cst.With):
            return None
        statement = owner
    return None


def _forward_model(
    facts: PythonFacts,
    run: list[cst.BaseStatement],
    forwards: list[cst.Call],
    function: cst.FunctionDef | None,
    kind: str,
) -> cst.BaseExpression | None:
    """The wrapped model ``run`` runs the forward of (``forwards``: those of its first statement), named as an
    expression of ``function`` (see ``forward_run``)."""
    wrappers = {
        frozenset(id(w) for w in wrapper_calls(facts, forward_target(c), c, kind))
        for statement in run
        for c in facts.reachable_calls(statement)
        if runs_wrapped(facts, c, kind)
    }
    if len(wrappers) > 1:
        return None
    for forward in forwards:
        target = forward_target(forward)
        if facts.enclosing_function(forward) is function or (
            (isinstance(target, cst.Attribute) and is_name(target.value, "self"))
            and function is not None
            and facts.enclosing_class(forward) is facts.enclosing_class(function)
        ):
            return target
    for statement in run:  # the forward runs in a helper: the model is what the run passes to it
        for expr in facts.within(statement, cst.Name, cst.Attribute):
            if (
                facts.enclosing_function(expr) is function
                and not isinstance(facts.parent(expr), cst.Attribute)  # read as a whole
                and is_wrapped(facts, expr, expr, kind)
            ):
                return expr
    return None


# What a module's text must hold to build a wrapper of each kind (spares reading the modules that cannot).
WRAPPER_MARKERS = {
    "ddp": ("DistributedDataParallel", "DDP("),
    "fsdp1": ("FullyShardedDataParallel", "FSDP("),
    "fsdp2": ("fully_shard",),
}


def wraps_elsewhere(facts: PythonFacts, kind: str = "ddp") -> bool:
    """Whether this module calls a function of another project module that builds a wrapper of ``kind`` itself
    (h2o-llmstudio's ``wrap_model_distributed``)."""
    names, markers = WRAPPERS_BY_KIND[kind], WRAPPER_MARKERS[kind]
    return any(facts.wraps_in_another_module(call, names, markers) for call in facts.calls)


def wrapped_parameters_run(facts: PythonFacts, kind: str = "ddp") -> bool:
    """Whether a function of this module runs one of its parameters as a model (``ddp_model(batch)``) that its
    callers in the project pass wrapped by ``kind``: a helper module's training step."""
    return facts.project is not None and any(
        isinstance(call.func, cst.Name)
        and facts.parameter(call.func.value, call) is not None
        and is_wrapped(facts, call.func, call, kind)
        for call in facts.calls
    )


def names_bound_to_wrapped(facts: PythonFacts, also: Callable[[cst.Call], bool]) -> set[str]:
    """The names this module assigns what a wrapper call returns, or a call ``also`` accepts (an accelerator's
    ``prepare``, ``deepspeed.initialize``): ``model`` of ``model = DDP(net)``, ``engine`` of ``engine, *_ =
    deepspeed.initialize(...)``, ``model`` of ``self.model = ...``. A wrapped model's forward in this module runs
    through one of them, or through a parameter."""
    names: set[str] = set()
    wrappers = {id(call) for call in facts.wrapped_models()}  # memoized per file: one callee question per call
    for call in facts.calls:
        if id(call) not in wrappers and not also(call):
            continue
        statement = next((a for a in facts.ancestors(call) if isinstance(a, (cst.Assign, cst.AnnAssign))), None)
        if isinstance(statement, cst.Assign):
            targets = [t.target for t in statement.targets]
        else:
            targets = [statement.target] if statement is not None else []
        names.update(n.value for t in targets for n in facts.within(t, cst.Name))
    return names
