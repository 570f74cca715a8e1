"""What a sampler is: whether it shards by rank, keeps the order, can be None, and what tells it the epoch."""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import SAMPLER_CLASSES, PythonFacts, argument_of
from lintdist.values import constant_truth

SEQUENTIAL_SAMPLERS = frozenset({"torch.utils.data.SequentialSampler", "torch.utils.data.sampler.SequentialSampler"})
BATCH_SAMPLERS = frozenset({"torch.utils.data.BatchSampler", "torch.utils.data.sampler.BatchSampler"})
# Samplers of other libraries named like `OrderedDistributedSampler` (timm) keep the file order.
UNSHUFFLED_NAME_PARTS = ("Ordered", "Sequential")
SET_EPOCH = "set_epoch"


def rank_aware(facts: PythonFacts, node: cst.CSTNode) -> bool:
    """``DistributedSampler`` or a subclass, a class named ``Distributed...Sampler``, or a sampler given
    ``num_replicas=`` and ``rank=``; not one told that there is a single replica."""
    if not isinstance(node, cst.Call):
        return False
    replicas = argument_of(node, "num_replicas", None)
    if isinstance(replicas, cst.Integer) and replicas.evaluated_value == 1:
        return False
    if facts.is_instance_of(node, SAMPLER_CLASSES, "DistributedSampler"):
        return True
    name = _class_name(node)
    if name.startswith("Distributed") and name.endswith("Sampler"):
        return True
    return replicas is not None and argument_of(node, "rank", None) is not None


def keeps_order(facts: PythonFacts, expr: cst.BaseExpression, at: cst.CSTNode, batched: bool = False) -> bool:
    """The sampler ``expr`` holds (or, ``batched``, the sampler inside that batch sampler) says it does not shuffle:
    a ``SequentialSampler``, or a ``DistributedSampler`` given ``shuffle=False``."""
    for origin in facts.origins(expr, at):
        node = origin.node
        if not isinstance(node, cst.Call):
            continue
        if batched and facts.callee_is(node, BATCH_SAMPLERS):
            inner = argument_of(node, "sampler", 0)
            if inner is not None and keeps_order(facts, inner, node):
                return True
            continue
        if facts.callee_is(node, SEQUENTIAL_SAMPLERS):
            return True
        if facts.is_instance_of(node, SAMPLER_CLASSES):
            shuffle = argument_of(node, "shuffle", 3)
            if shuffle is not None and constant_truth(shuffle) is False:
                return True
    return False


def unshuffled_by_name(facts: PythonFacts, sampler: cst.Call) -> bool:
    """A sampler of another library whose class name says it keeps the order (``OrderedDistributedSampler``)."""
    if facts.is_instance_of(sampler, SAMPLER_CLASSES):
        return False
    return any(part in _class_name(sampler) for part in UNSHUFFLED_NAME_PARTS)


def sampler_kinds(facts: PythonFacts, expr: cst.BaseExpression, at: cst.CSTNode) -> set[str]:
    """What a ``sampler=`` argument can be: "none"; "sampler" (a class built there, never None); "unknown" (another
    call, a name from elsewhere, a parameter that takes a value); "maybe" (a parameter that defaults to ``None`` and
    whose callers are out of sight)."""
    kinds = set()
    for origin in facts.origins(expr, at):
        node = origin.node
        if constant_truth(node) is not None:
            kinds.add("none" if isinstance(node, cst.Name) and node.value == "None" else "unknown")
        elif isinstance(node, cst.Param):
            function = facts.enclosing_function(node)
            is_none = constant_truth(node.default) is not None and node.default.value == "None"
            if function is not None and facts.call_sites(function):
                # every call in sight passes nothing here, so the default is what arrives
                kinds.add("none" if node.default is None or is_none else "unknown")
            else:
                kinds.add("maybe" if is_none else "unknown")
        elif isinstance(node, cst.Call) and origin.index is None and _class_name(node)[:1].isupper():
            kinds.add("sampler")  # a class is instantiated (`DistributedSampler(...)`): never None
        else:
            kinds.add("unknown")
    return kinds


def is_set_epoch(facts: PythonFacts, call: cst.Call) -> bool:
    """``x.set_epoch(...)``, also spelled ``getattr(x, "set_epoch", ...)(...)``."""
    if facts.method_name(call) == SET_EPOCH:
        return True
    func = call.func
    return (
        isinstance(func, cst.Call)
        and get_full_name_for_node(func.func) == "getattr"
        and len(func.args) >= 2
        and isinstance(func.args[1].value, cst.SimpleString)
        and func.args[1].value.evaluated_value == SET_EPOCH
    )


def tells_epoch(facts: PythonFacts, definition: cst.CSTNode) -> bool:
    """``definition`` (a class or function) calls ``set_epoch(...)`` or assigns an ``.epoch`` attribute."""
    if any(facts.method_name(call) == SET_EPOCH for call in facts.calls_within(definition)):
        return True
    for statement in facts.within(definition, cst.Assign, cst.AugAssign):
        targets = [t.target for t in statement.targets] if isinstance(statement, cst.Assign) else [statement.target]
        if any(isinstance(t, cst.Attribute) and t.attr.value == "epoch" for t in targets):
            return True
    return False


def _class_name(call: cst.Call) -> str:
    return (get_full_name_for_node(call.func) or "").rsplit(".", 1)[-1]


def epoch_told_around(facts: PythonFacts, loop: cst.For | cst.While) -> bool:
    """``set_epoch`` runs (reachably through the file's helpers) in ``loop`` or in a loop around it within its
    function (then ``loop`` only repeats passes within one epoch)."""
    loops = [loop]
    for ancestor in facts.ancestors(loop):
        if isinstance(ancestor, (cst.FunctionDef, cst.Lambda)):
            break
        if isinstance(ancestor, (cst.For, cst.While)):
            loops.append(ancestor)
    return any(is_set_epoch(facts, call) for each in loops for call in facts.reachable_calls(each.body))


def epoch_told_out_of_sight(facts: PythonFacts, loop: cst.For | cst.While) -> bool:
    """A function of this file outside ``loop``'s own calls ``set_epoch`` but nothing here calls it by name: a
    callback or hook (``cb.on_epoch_start(epoch)``) lintdist cannot follow may run it."""
    for call in facts.calls:
        if is_set_epoch(facts, call):
            function = facts.enclosing_function(call)
            if function is not None and not facts.is_within(loop, function) and not facts.call_sites(function):
                return True
    return False


def wrapper_tells_epoch(facts: PythonFacts, loader: cst.BaseExpression, at: cst.CSTNode) -> bool:
    """``loader`` is a wrapper built by a class or function of the project (this module or another) that tells the
    sampler the epoch itself (an endless loader bumping ``loader.sampler.epoch`` at each restart)."""
    for origin in facts.origins(loader, at):
        node = origin.node
        if not isinstance(node, cst.Call) or origin.index is not None:
            continue
        name = get_full_name_for_node(node.func) or ""
        local = [*(c for c in facts.classes if c.name.value == name), *facts.functions.get(name, ())]
        if any(tells_epoch(facts, definition) for definition in local):
            return True
        if facts.project is None or local or not facts.imported_root(node.func):
            continue
        for qualified in facts.qualified_names(node.func):
            found = facts.project.definition(qualified, ("epoch",))
            if found is not None and tells_epoch(*found):
                return True
    return False


def reseeded_each_pass(facts: PythonFacts, sampler: cst.Call, loop: cst.For | cst.While, counter: str | None) -> bool:
    """The sampler is built inside ``loop`` with a ``seed`` that changes with it: it reads the loop's target, its
    ``counter``, or a name bound inside the loop (``seed=base + epoch``)."""
    if not facts.is_within(sampler, loop):
        return False
    seed = argument_of(sampler, "seed", 4)
    if seed is None:
        return False
    counters = {name.value for name in facts.within(loop.target, cst.Name)} if isinstance(loop, cst.For) else set()
    counters.add(counter or "")
    return any(
        name.value in counters
        or any(facts.is_within(binding.statement, loop) for binding in facts.bindings(name.value, seed))
        for name in facts.within(seed, cst.Name)
    )


def may_tell_epoch_of(facts: PythonFacts, call: cst.Call, loader: cst.CSTNode) -> bool:
    """``call`` is a ``set_epoch`` that may reach the sampler of ``loader`` (a loader's construction):
    ``loader.sampler.set_epoch(e)``, ``set_epoch(loader, e)``, or one on something lintdist cannot follow."""
    if facts.method_name(call) != SET_EPOCH:
        return False
    if isinstance(call.func, cst.Attribute):
        receiver = call.func.value
        while isinstance(receiver, cst.Attribute) and receiver.attr.value in {"sampler", "batch_sampler"}:
            receiver = receiver.value
    elif call.args:
        receiver = call.args[0].value
    else:
        return True
    origins = facts.origins(receiver, call)
    if any(o.node is loader for o in origins):
        return True
    # every value is something else lintdist can see (another sampler, None): not this loader's
    return not all(isinstance(o.node, (cst.Call, cst.Name)) and o.node is not receiver for o in origins)


def torch_sampler(facts: PythonFacts, node: cst.CSTNode) -> bool:
    """``node`` builds one of ``torch.utils.data``'s samplers (``RandomSampler(ds)``, ``DistributedSampler(ds)``,
    any class of that package named ``...Sampler``)."""
    if not isinstance(node, cst.Call):
        return False
    for qualified in facts.qualified_names(node.func):
        module, _, name = qualified.rpartition(".")
        if name.endswith("Sampler") and module.startswith("torch.utils.data"):
            return True
    return False


def rank_aware_among(facts: PythonFacts, values: list[cst.CSTNode], batched: bool = False) -> list[cst.Call]:
    """The rank-aware samplers among the values a loader's ``sampler=`` argument may hold (``batched``: its
    ``batch_sampler=`` argument, whose batch samplers shard by the sampler they wrap, ``BatchSampler(
    DistributedSampler(ds), ...)``)."""
    hits = []
    for node in values:
        if rank_aware(facts, node):
            hits.append(node)
        elif batched and isinstance(node, cst.Call):
            wrapped = argument_of(node, "sampler", 0)
            if wrapped is not None:
                hits.extend(o.node for o in facts.origins(wrapped, node) if rank_aware(facts, o.node))
    return hits


def padding_sampler(facts: PythonFacts, loader: cst.BaseExpression, at: cst.CSTNode) -> cst.Call | None:
    """The ``DistributedSampler`` (or a subclass of this file) behind a loader expression (through ``enumerate``/
    ``tqdm``) when it pads: not given ``drop_last=True``, so every rank gets ``ceil(len(dataset) / world)``
    indices, the last ones repeated from the start. None for a loader prepared by accelerate, a sampler that drops,
    or one lintdist cannot find."""
    from lintdist.loaders import loader_calls

    for call in loader_calls(facts, loader, at):
        sampler = argument_of(call, "sampler", 3)
        if sampler is None:
            continue
        for origin in facts.origins(sampler, call):
            node = origin.node
            if _pads(facts, node) or (origin.index is None and helper_returns_padding(facts, node)):
                return node
    return None


def _pads(facts: PythonFacts, node: cst.CSTNode) -> bool:
    # torch's class or a subclass of this file: other libraries' `UnpaddedDistributedSampler`,
    # `DistributedEvalSampler` exist because they do not pad
    if isinstance(node, cst.Call) and rank_aware(facts, node) and facts.is_instance_of(node, SAMPLER_CLASSES):
        drop_last = argument_of(node, "drop_last", 5)
        return drop_last is None or constant_truth(drop_last) is False
    return False


def helper_returns_padding(facts: PythonFacts, node: cst.CSTNode) -> bool:
    """``node`` calls a function of another project module that may return a padding ``DistributedSampler``
    (``utils.get_sampler(ds)`` returning ``DistributedSampler(ds)`` when several processes run), followed one level."""
    if not isinstance(node, cst.Call) or facts.project is None or facts.local_functions(node):
        return False
    if not facts.imported_root(node.func):
        return False
    for qualified in facts.qualified_names(node.func):
        found = facts.project.definition(qualified, ("DistributedSampler",))
        if found is None or not isinstance(found[1], cst.FunctionDef):
            continue
        other, function = found
        for returned in other.returns.get(function, ()):
            if any(_pads(other, o.node) for o in other.origins(returned, returned)):
                return True
    return False
