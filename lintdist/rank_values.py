"""Whether a value is the same on every rank, and whether code makes every rank meet.

A rank-local value is one each process computes from its own data or clock: a loss or metric of this rank
(``loss.item()``, ``val_loss``), an early-stopping counter or flag set from one, a wall-clock reading. A rank-uniform
value is a setting (``args.patience``, a constant, a literal), a step or epoch count, or a value reduced, gathered or
broadcast across ranks first (``accelerator.gather``, ``dist.all_reduce(t)``, a metric fed with gathered values, a
helper of the file that reduces). The answers follow names to their bindings in this file, a few levels deep.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import argument_of

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts

# Calls whose value is the same on every rank: a reduction or gather across ranks, accelerate's trigger, a broadcast.
REDUCING = frozenset(
    {"gather", "gather_for_metrics", "gather_object", "reduce", "all_reduce", "all_gather", "all_gather_object"}
    | {"all_gather_into_tensor", "broadcast", "broadcast_object_list", "check_trigger", "any_rank", "reduce_dict"}
    | {"all_reduce_mean", "sync_across_processes"}
)
# torch.distributed collectives that write their result into their first argument.
IN_PLACE = frozenset({"all_reduce", "reduce", "broadcast", "broadcast_object_list", "all_gather", "all_gather_object"})
# Calls every rank must join: a collective, a backward pass (a wrapped model's gradient all-reduce), a barrier.
JOINING = REDUCING | frozenset(
    {"backward", "wait_for_everyone", "barrier", "pad_across_processes", "save_state", "reduce_scatter"}
)
# Words of a name that holds a rank-local value: a loss, a metric, an early-stopping counter or flag.
LOCAL_WORD = re.compile(
    r"loss|metric|acc(?!el|um)|patience|score|ppl|perplex|best|stop|improve|plateau|bad_|_bad|f1|bleu|rouge|reward|"
    r"nan|finite|grad_norm|converge|diverge|wait|no_gain|tolerance",
    re.IGNORECASE,
)
# Wall-clock readings: each rank reads its own.
CLOCKS = frozenset({"time.time", "time.perf_counter", "time.monotonic", "time.time_ns", "time.perf_counter_ns"})
# Objects that hold the run's settings: the same on every rank.
CONFIG_ROOTS = frozenset(
    {"args", "config", "cfg", "conf", "opt", "opts", "hparams", "hp", "params", "FLAGS", "settings"}
)
# Flags every rank holds alike: transformers' `TrainerControl` is set by callbacks from gathered metrics and step
# counts on every process.
UNIFORM_FLAGS = frozenset({"should_training_stop", "should_epoch_stop"})
CONSTANTS = frozenset({"True", "False", "None"})
COUNTER_PART = re.compile(r"(?:^|_)(?:steps?|epochs?|iters?|iterations?|updates?|batch(?:es)?|samples|tokens)(?:$|_)")
FOLLOWS_METRIC = re.compile(r"patience|best|stop|wait|loss|metric|bad|improve|score|acc(?!el|um)")
MAX_LEVELS = 3


def joins_every_rank(facts: PythonFacts, node: cst.CSTNode) -> bool:
    """Whether ``node`` does something every rank must join (a backward pass, a collective, a barrier), directly or
    in a local function it calls."""
    memo = facts._memo.setdefault("joins_every_rank", {})
    if id(node) not in memo:
        memo[id(node)] = any(facts.method_name(call) in JOINING for call in facts.reachable_calls(node))
    return memo[id(node)]


def rank_local_reason(facts: PythonFacts, test: cst.BaseExpression, at: cst.CSTNode, depth: int = 0) -> str | None:
    """Why ``test`` may differ between ranks, as the rank-local value it reads (```loss.item()```, ```bad_epochs```
    (set from ...)``, a clock), or None when it reads only rank-uniform values."""
    calls = facts.index.within(test, cst.Call)
    if any(_reduces(facts, call) for call in calls):
        return None  # reduced here, or a helper of this file that agrees across ranks (`should_stop_all(val_loss)`)
    for call in calls:
        if facts.callee_is(call, CLOCKS):
            return f"`{code_text(call)}` (each rank reads its own clock)"
    for call in calls:
        if facts.method_name(call) == "item" and isinstance(call.func, cst.Attribute):
            key = root_key(call.func.value)
            if key is None or not reduced(facts, key, at):
                return f"`{code_text(call)}`"
    keys = []
    for node in reads(facts, test):
        key = get_full_name_for_node(node)
        if not key or key in CONSTANTS or key in keys:
            continue
        if counter_name(key.rsplit(".", 1)[-1]) or uniform_setting(facts, key, node) or reduced(facts, key, at):
            continue
        keys.append(key)
    for key in keys:
        if LOCAL_WORD.search(key.rsplit(".", 1)[-1]):
            return f"`{key}`"
    for call in calls:
        # a value computed by a function named for a loss or metric (`validation_loss(model, loader)`)
        callee = get_full_name_for_node(call.func) or ""
        last = callee.rsplit(".", 1)[-1]
        if last and LOCAL_WORD.search(last) and not counter_name(last):
            return f"`{callee}(...)`"
    if depth < 2:
        for key in keys:
            for binding in facts.bindings(key, at):
                why = _local_binding(facts, binding, depth)
                if why:
                    return f"`{key}` ({why})"
    return None


def uniform_setting(facts: PythonFacts, key: str, at: cst.CSTNode) -> bool:
    """Whether ``key`` names a setting every rank holds alike: a command-line or config field (``args.patience``,
    ``self.config.early_stop``), a constant (``PATIENCE``), a parameter with a literal default, a name bound only to
    literals and never counted (``n += 1``), or a ``TrainerControl`` flag."""
    parts = key.split(".")
    if parts[-1] in UNIFORM_FLAGS or parts[-1].isupper():
        return True
    if parts[0] in {"self", "cls"}:
        parts = parts[1:]
    if len(parts) > 1 and (parts[0] in CONFIG_ROOTS or parts[0].endswith(("args", "config", "cfg"))):
        return True
    bindings = facts.bindings(key, at)
    if bindings:
        return all(literal(b.value) for b in bindings) and key not in _counted(facts)
    found = facts.parameter(key, at) if len(parts) == 1 and "." not in key else None
    return found is not None and found[2].default is not None and literal(found[2].default)


def reduced(facts: PythonFacts, key: str, at: cst.CSTNode, depth: int = 0) -> bool:
    """Whether ``key`` holds a value made the same on every rank: bound from a reduction or gather (or from a helper
    that reduces, or from names that are), reduced in place (``dist.all_reduce(t)``), or fed with gathered values
    (``metric.add_batch(accelerator.gather_for_metrics(...))`` ... ``metric.compute()``)."""
    memo = facts._memo.setdefault("reduced_values", {})
    scope = facts.enclosing_function(at)
    token = (key, id(scope), depth)
    if token not in memo:
        memo[token] = False  # a cycle through the same name answers no
        memo[token] = any(_reducing_value(facts, b.value, depth) for b in facts.bindings(key, at)) or _reduced_later(
            facts, key, at, scope, depth
        )
    return memo[token]


def reads(facts: PythonFacts, expr: cst.BaseExpression) -> list[cst.CSTNode]:
    """The names and attribute chains ``expr`` reads, outermost (``a.b.c``, not ``a.b``), not a call's callee nor a
    keyword's name."""
    found = []
    for node in facts.index.within(expr, cst.Name, cst.Attribute):
        parent = facts.parent(node)
        if (
            (isinstance(parent, cst.Attribute) and (parent.value is node or parent.attr is node))
            or (isinstance(parent, cst.Call) and parent.func is node)
            or (isinstance(parent, cst.Arg) and parent.keyword is node)
        ):
            continue
        found.append(node)
    return found


def root_key(expr: cst.BaseExpression) -> str | None:
    """The name whose value an expression reads from: ``losses`` of ``losses[0].mean()``, ``self.x`` of
    ``self.x.y``."""
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


def literal(expr: cst.BaseExpression) -> bool:
    """Whether ``expr`` is a number, string, bool or None (possibly negated): ``5``, ``-1``, ``1e-3``,
    ``float("inf")``."""
    if isinstance(expr, cst.UnaryOperation):
        expr = expr.expression
    if isinstance(expr, (cst.Integer, cst.Float, cst.SimpleString)):
        return True
    if isinstance(expr, cst.Name):
        return expr.value in CONSTANTS
    return (
        isinstance(expr, cst.Call)
        and get_full_name_for_node(expr.func) in {"float", "int"}
        and all(literal(a.value) for a in expr.args)
    )


def counter_name(name: str) -> bool:
    """Whether a name is a step or epoch count (``eval_steps``, ``max_train_steps``), not one that follows a metric
    (``best_step``)."""
    lower = name.lower()
    return bool(COUNTER_PART.search(lower)) and not FOLLOWS_METRIC.search(lower)


def _reduces(facts: PythonFacts, call: cst.Call) -> bool:
    """A reducing call, or a call of a local function that reduces."""
    return facts.method_name(call) in REDUCING or any(
        facts.method_name(inner) in REDUCING
        for function in facts.local_functions(call)
        for inner in facts.reachable_calls(function)
    )


def _counted(facts: PythonFacts) -> set[str | None]:
    """The targets of ``x += ...`` in the file: counters, not settings."""
    if "augmented_targets" not in facts._memo:
        facts._memo["augmented_targets"] = {
            get_full_name_for_node(node.target) for node in facts.index.nodes(cst.AugAssign)
        }
    return facts._memo["augmented_targets"]


def _local_binding(facts: PythonFacts, binding, depth: int) -> str | None:
    """A flag or value set from a rank-local value, or set under a rank-local test."""
    value = binding.value
    if not (isinstance(value, cst.Name) and value.value in CONSTANTS):
        why = rank_local_reason(facts, value, binding.statement, depth + 1)
        if why:
            return f"set from {why}"
    for ancestor in facts.ancestors(binding.statement):
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Module)):
            break
        if isinstance(ancestor, cst.If):
            why = rank_local_reason(facts, ancestor.test, ancestor, depth + 1)
            if why:
                return f"set under a test of {why}"
    return None


def _reduced_later(facts: PythonFacts, key: str, at: cst.CSTNode, scope, depth: int) -> bool:
    """``key`` reduced in place by a statement of its scope (``dist.all_reduce(t)``), or given gathered values
    (``losses.append(accelerator.gather(...))``)."""
    root = key.split(".", 1)[0] if not key.startswith("self.") else key
    for call in facts.calls_within(scope if scope is not None else facts.index.module):
        first = root_key(call.args[0].value) if call.args else None
        if (
            facts.method_name(call) in IN_PLACE
            and first == root
            and isinstance(facts.parent(call), cst.Expr)
            and not facts.is_within(at, call)
        ):
            return True
        receiver = root_key(call.func.value) if isinstance(call.func, cst.Attribute) else None
        if receiver == root and _reducing_arguments(facts, call, depth):
            return True
    return False


def _reducing_value(facts: PythonFacts, value: cst.BaseExpression, depth: int) -> bool:
    calls = facts.index.within(value, cst.Call)
    if any(_reduces(facts, call) for call in calls):
        return True
    if depth >= MAX_LEVELS:
        return False
    # `metric.compute()` of a metric fed with gathered values
    receivers = [root_key(c.func.value) for c in calls if isinstance(c.func, cst.Attribute)]
    if any(r and reduced(facts, r, value, depth + 1) for r in receivers):
        return True
    keys = (get_full_name_for_node(node) for node in reads(facts, value))
    return any(k and k not in CONSTANTS and reduced(facts, k, value, depth + 1) for k in keys)


def _reducing_arguments(facts: PythonFacts, call: cst.Call, depth: int) -> bool:
    """``call`` is given a gathered or reduced value: a reducing call inside it, or a name that holds one."""
    if any(facts.method_name(c) in REDUCING for c in facts.calls_within(call)):
        return True
    if depth >= MAX_LEVELS:
        return False
    keys = (get_full_name_for_node(node) for arg in call.args for node in reads(facts, arg.value))
    return any(k and reduced(facts, k, call, depth + 1) for k in keys)


def code_text(node: cst.CSTNode) -> str:
    """The source text of ``node``, without surrounding whitespace (for messages)."""
    return cst.Module([]).code_for_node(node).strip()


# -- the global rank ---------------------------------------------------------------------------------------------

GET_RANK = frozenset(
    {"torch.distributed.get_rank", "torch.distributed.distributed_c10d.get_rank", "torch.distributed.get_global_rank"}
)
ACCELERATE_STATES = frozenset(
    {"accelerate.PartialState", "accelerate.state.PartialState", "accelerate.AcceleratorState"}
    | {"accelerate.state.AcceleratorState"}
)
CONVERSIONS = frozenset({"int", "str"})
# A module none of whose text reads a rank cannot hold a helper that returns the global one.
GLOBAL_RANK_MARKERS = ("get_rank", "RANK", "process_index")
MAX_RANK_DEPTH = 4


def global_rank(
    facts: PythonFacts, expr: cst.BaseExpression, at: cst.CSTNode, depth: int = 0, crossed: bool = False
) -> str | None:
    """How ``expr`` holds the global rank, in words (``dist.get_rank()``, ``os.environ["RANK"]``, an accelerator's
    ``process_index``, a helper of the project returning one), following names, attributes and parameters to their
    values; None when it is not surely the global rank (``rank % n``, ``LOCAL_RANK``). ``crossed``: asked from
    another module, follow no further helpers."""
    if depth > MAX_RANK_DEPTH:
        return None
    expr = unconverted(expr)
    found = global_rank_read(facts, expr, crossed)
    if found is not None or not isinstance(expr, (cst.Name, cst.Attribute, cst.Call)):
        return found
    for origin in facts.origins(expr, at):
        node = origin.node
        if node is expr or origin.index is not None or not isinstance(node, cst.BaseExpression):
            continue
        found = global_rank(facts, node, node, depth + 1, crossed)
        if found is not None:
            return found
    return None


def global_rank_read(facts: PythonFacts, expr: cst.BaseExpression, crossed: bool = False) -> str | None:
    """How ``expr`` itself reads the global rank, in words: ``dist.get_rank()``, ``os.environ["RANK"]`` (also
    ``.get``/``os.getenv``), an Accelerator's or ``PartialState``'s ``process_index``, or a call of a function of
    another project module that returns one of them (unless ``crossed``); None otherwise."""
    from lintdist.environment import environment_key

    getter = isinstance(expr, cst.Call) and facts.method_name(expr) in {"get_rank", "get_global_rank"}
    if getter and facts.callee_is(expr, GET_RANK):
        return "`dist.get_rank()`"
    if isinstance(expr, cst.Call) and not crossed:
        helper = _rank_helper(facts, expr)
        if helper is not None:
            return helper
    if isinstance(expr, (cst.Call, cst.Subscript)):
        return '`os.environ["RANK"]`' if environment_key(facts, expr) == "RANK" else None
    if isinstance(expr, cst.Attribute) and expr.attr.value == "process_index":
        owner = expr.value
        if facts.accelerator_like(owner, expr) or any(
            isinstance(o.node, cst.Call) and facts.callee_is(o.node, ACCELERATE_STATES) for o in facts.origins(owner)
        ):
            return "accelerate's `process_index` counts processes on all nodes"
    return None


def _rank_helper(facts: PythonFacts, call: cst.Call) -> str | None:
    """``utils.get_rank()``: a function of another project module that returns the global rank (timm's and dino's
    helpers return ``dist.get_rank()``), followed one module deep."""
    if facts.project is None or facts.local_functions(call) or not facts.imported_root(call.func):
        return None
    for qualified in facts.qualified_names(call.func):
        found = facts.project.definition(qualified, GLOBAL_RANK_MARKERS)
        if found is None or not isinstance(found[1], cst.FunctionDef):
            continue
        other, function = found
        for returned in other.returns.get(function, ()):
            how = global_rank(other, returned, returned, 1, crossed=True)
            if how is not None:
                return f"`{qualified.rsplit('.', 1)[-1]}()` returns {how}"
    return None


def unconverted(expr: cst.BaseExpression) -> cst.BaseExpression:
    """The value under ``int(...)``/``str(...)`` conversions: ``x`` of ``int(x)`` and of ``str(int(x))``."""
    while isinstance(expr, cst.Call) and get_full_name_for_node(expr.func) in CONVERSIONS and expr.args:
        expr = expr.args[0].value
    return expr


# -- the local rank ----------------------------------------------------------------------------------------------

# torch 2.13 `distributed_c10d.py::get_node_local_rank` reads `LOCAL_RANK` (its fallback when unset is a default).
GET_LOCAL_RANK = frozenset(
    {"torch.distributed.get_node_local_rank", "torch.distributed.distributed_c10d.get_node_local_rank"}
)
# Attributes that hold the rank on this node: torch.distributed.launch's `--local_rank` argument, accelerate's index.
LOCAL_RANK_ATTRIBUTES = frozenset({"local_rank", "local_process_index"})


def local_rank(
    facts: PythonFacts, expr: cst.BaseExpression, at: cst.CSTNode, depth: int = 0, crossed: bool = False
) -> str | None:
    """How ``expr`` holds the rank on this node only, in words (``os.environ["LOCAL_RANK"]``, ``args.local_rank``,
    an accelerator's ``local_process_index``, ``dist.get_node_local_rank()``), following names, attributes and
    parameters to their values; None when any value it may take is something else (``RANK``, ``node_rank * n +
    local_rank``, a parameter with no caller in sight). A parameter no call of this file passes is followed to
    the calls of other project modules, one module away (``crossed``: asked from there, no further)."""
    if depth > MAX_RANK_DEPTH:
        return None
    expr = unconverted(expr)
    found = local_rank_read(facts, expr)
    if found is not None or not isinstance(expr, (cst.Name, cst.Attribute, cst.Call)):
        return found
    words = None
    for origin in facts.origins(expr, at):
        node = origin.node
        if node is expr and isinstance(expr, cst.Attribute):
            how = local_rank_read(facts, expr, unbound=True)
        elif isinstance(node, cst.Param) and isinstance(expr, cst.Name) and not crossed:
            how = _passed_local_rank(facts, expr, at)
        elif origin.index is not None or not isinstance(node, cst.BaseExpression) or node is expr:
            return None
        else:
            how = local_rank(facts, node, node, depth + 1, crossed)
        if how is None:
            return None  # one value it may take is not the local rank (`rank = args.local_rank if ... else RANK`)
        words = words or how
    return words


def local_rank_read(facts: PythonFacts, expr: cst.BaseExpression, unbound: bool = False) -> str | None:
    """How ``expr`` itself reads the local rank, in words: ``os.environ["LOCAL_RANK"]`` (``.get``, ``os.getenv``),
    ``dist.get_node_local_rank()``, ``x.local_process_index`` of an Accelerator or ``PartialState``; with
    ``unbound`` (an attribute nothing in sight assigns), ``args.local_rank`` too. None otherwise."""
    from lintdist.environment import environment_key

    if isinstance(expr, cst.Call) and facts.method_name(expr) == "get_node_local_rank":
        return "`dist.get_node_local_rank()`" if facts.callee_is(expr, GET_LOCAL_RANK) else None
    if isinstance(expr, (cst.Call, cst.Subscript)):
        return '`os.environ["LOCAL_RANK"]`' if environment_key(facts, expr) == "LOCAL_RANK" else None
    if not isinstance(expr, cst.Attribute) or expr.attr.value not in LOCAL_RANK_ATTRIBUTES:
        return None
    if expr.attr.value == "local_process_index":
        owner = expr.value
        if facts.accelerator_like(owner, expr) or any(
            isinstance(o.node, cst.Call) and facts.callee_is(o.node, ACCELERATE_STATES) for o in facts.origins(owner)
        ):
            return "accelerate's `local_process_index`"
        return None
    if unbound:
        return f"`{code_text(expr)}`, the `--local_rank` a launcher passes"
    return None


def _passed_local_rank(facts: PythonFacts, name: cst.Name, at: cst.CSTNode) -> str | None:
    """What the calls of other project modules pass for parameter ``name`` (``ddp_setup(local_rank=local_rank)``
    in ``main.py``), when each passes the local rank; None when none is in sight or one passes something else."""
    found = facts.parameter(name.value, at)
    if facts.project is None or found is None:
        return None
    function, index, param = found
    exported = facts._exported_name(function)
    if exported is None or "." in exported:
        return None  # a method: its instance's callers are not followed
    words = None
    for site in facts.project.callers(exported, ("LOCAL_RANK", "local_rank", "local_process_index")):
        argument = argument_of(site.call, param.name.value, None if index < 0 else index)
        how = local_rank(site.facts, argument, site.call, 1, crossed=True) if argument is not None else None
        if how is None:
            return None
        words = words or f"{how}, passed at {site.facts._where(site.call)}"
    return words


def local_rank_in_scope(facts: PythonFacts, at: cst.CSTNode) -> str | None:
    """Code for the local rank that a statement at ``at`` can read, for a fix: a name its function (or the module)
    bound before it to the local rank (``local_rank = int(os.environ["LOCAL_RANK"])``), else an Accelerator's
    ``local_process_index`` (``accelerator = Accelerator()`` before it); None when neither is in sight."""
    from lintdist.facts import ACCELERATOR_CLASSES

    scope, order = facts.enclosing_function(at), facts.index.order(at)
    accelerator = None
    for assign in facts.index.nodes(cst.Assign):
        if facts.index.order(assign) >= order or facts.enclosing_function(assign) not in {scope, None}:
            continue
        target = assign.targets[0].target if len(assign.targets) == 1 else None
        if not isinstance(target, cst.Name):
            continue
        if local_rank(facts, assign.value, assign) is not None:
            return target.value
        value = assign.value
        if isinstance(value, cst.Call) and facts.callee_is(value, ACCELERATOR_CLASSES) and accelerator is None:
            accelerator = f"{target.value}.local_process_index"
    return accelerator
