"""Whether a dataset is split across ranks already: iterable or streamed, or built from the process's rank."""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.datasets import LOAD_DATASET
from lintdist.facts import RANK_GETTERS, RANK_NAMES, PythonFacts, argument_of
from lintdist.values import constant_truth

ITERABLE_CLASSES = frozenset(
    {
        "torch.utils.data.IterableDataset",
        "torch.utils.data.dataset.IterableDataset",
        "torch.utils.data.IterDataPipe",
        "torch.utils.data.datapipes.datapipe.IterDataPipe",
        "datasets.IterableDataset",
        "datasets.iterable_dataset.IterableDataset",
    }
)
# Libraries whose datasets stream (iterable) or split themselves by rank.
SELF_SHARDING_MODULES = ("webdataset", "torchdata", "streaming", "litdata", "ffcv")
# Parts of a dataset class's name that say it is iterable or streamed.
ITERABLE_NAME_PARTS = ("Iterable", "IterDataPipe", "Stream", "WebDataset")
# Calls and methods that make a dataset iterable or keep one rank's part of it.
SHARDING_CALLS = frozenset({"split_dataset_by_node", "to_iterable_dataset", "shard", "IterableDatasetShard"})
# Where a rank only chooses the device, not the data: `.to(rank)`, `.cuda(local_rank)`, `device=...`.
DEVICE_METHODS = frozenset({"to", "cuda", "device", "set_device"})
RANK_VARIABLES = frozenset({"RANK", "LOCAL_RANK"})
MAX_DEPTH = 6


def split_by_rank(facts: PythonFacts, expr: cst.BaseExpression, at: cst.CSTNode) -> bool:
    """Whether the dataset ``expr`` (at ``at``) is iterable or streamed, or keeps one rank's part, as far as
    its values can be followed (subsets, concatenations, splits, method chains)."""
    return _split(facts, expr, at, 0, set())


def _split(facts: PythonFacts, expr: cst.BaseExpression, at: cst.CSTNode, depth: int, seen: set[int]) -> bool:
    if depth > MAX_DEPTH:
        return False
    for origin in facts.origins(expr, at):
        node = origin.node
        if id(node) in seen:
            continue
        seen.add(id(node))
        if mentions_rank(facts, node):
            return True
        parts: list[cst.BaseExpression] = []
        if isinstance(node, cst.Subscript):
            parts = [node.value]  # `dataset[rank::world]` is caught above; `splits["train"]` is followed
        elif isinstance(node, cst.Call):
            if iterable_call(facts, node):
                return True
            # `Subset(dataset, indices)`, `ConcatDataset([a, b])`; not the device of `.to(device)`, which may be
            # the rank's GPU (`torch.device(f"cuda:{rank}")`) without choosing any data
            parts = [] if facts.method_name(node) in DEVICE_METHODS else [arg.value for arg in node.args]
            if isinstance(node.func, cst.Attribute):
                parts.append(node.func.value)  # `dataset.shard(...)`, `dataset.with_format("torch")`
        elif isinstance(node, (cst.List, cst.Tuple)):
            parts = [element.value for element in node.elements]
        if any(part is not node and _split(facts, part, node, depth + 1, seen) for part in parts):
            return True
    return False


def iterable_call(facts: PythonFacts, call: cst.Call) -> bool:
    """Whether ``call`` builds an iterable, streamed or rank-sharded dataset (a class or library that shards,
    ``load_dataset(..., streaming=True)``, a local class that is iterable or reads the rank)."""
    names = facts.qualified_names(call.func) | {get_full_name_for_node(call.func) or ""}
    last = {name.rsplit(".", 1)[-1] for name in names}
    if not last.isdisjoint(SHARDING_CALLS) or facts.is_instance_of(call, ITERABLE_CLASSES):
        return True
    if any(name.startswith(SELF_SHARDING_MODULES) for name in names):
        return True
    if any(_iterable_name(name) for name in last):
        return True
    if facts.callee_is(call, LOAD_DATASET):
        streaming = argument_of(call, "streaming", None)
        if streaming is not None and not (isinstance(streaming, cst.Name) and streaming.value == "False"):
            return True
    return any(
        cls.name.value in last
        and facts.enclosing_class(cls) is None
        and (facts.derives_from(cls, _iterable_name) or mentions_rank(facts, cls))
        for cls in facts.classes
    )


def mentions_rank(facts: PythonFacts, node: cst.CSTNode) -> bool:
    """Whether ``node`` reads the process's rank (a rank variable, ``get_rank()``, ``"RANK"``) other than to
    choose a device."""
    found = [
        *(name for name in facts.within(node, cst.Name) if name.value in RANK_NAMES),
        *(call for call in facts.within(node, cst.Call) if facts.method_name(call) in RANK_GETTERS),
        *(s for s in facts.within(node, cst.SimpleString) if s.value.strip("\"'") in RANK_VARIABLES),
    ]
    return any(not device_use(facts, part, node) for part in found)


def device_use(facts: PythonFacts, node: cst.CSTNode, container: cst.CSTNode) -> bool:
    """Whether ``node`` (inside ``container``) only chooses a device: a ``device=`` argument, ``.to(...)``."""
    for ancestor in facts.ancestors(node):
        if isinstance(ancestor, cst.Arg) and ancestor.keyword is not None and "device" in ancestor.keyword.value:
            return True
        if isinstance(ancestor, cst.Call) and facts.method_name(ancestor) in DEVICE_METHODS:
            return True
        if ancestor is container:
            break
    return False


def _iterable_name(qualified: str) -> bool:
    return any(part in qualified.rsplit(".", 1)[-1] for part in ITERABLE_NAME_PARTS)


# -- streams no rank splits: every rank of a DDP job reads all of them ------------------------------------------

TORCH_ITERABLE = frozenset({"torch.utils.data.IterableDataset", "torch.utils.data.dataset.IterableDataset"})
# Names that split data across processes besides the rank itself: the world size, a shard count, a split helper.
SPLIT_NAMES = frozenset({"world_size", "num_replicas", "num_shards", "get_world_size", "world", "nprocs"})
# Methods of a `datasets` stream that return a stream of the same rows (so the split question is their receiver's).
STREAM_METHODS = frozenset(
    {"map", "filter", "shuffle", "with_format", "select_columns", "remove_columns", "rename_column", "take", "skip"}
    | {"rename_columns", "cast", "cast_column", "batch"}
)
FROM_GENERATOR = frozenset({"datasets.IterableDataset.from_generator"})
STREAM_OBJECT_BASES = frozenset({"object", "typing.Generic", "builtins.object"})
PENDING = cst.Call(func=cst.Name("pending"))  # an origin whose answer is being worked out
SPLIT = cst.Call(func=cst.Name("split"))  # an origin split by rank


def unsplit_stream(facts: PythonFacts, expr: cst.BaseExpression, at: cst.CSTNode) -> cst.Call | None:
    """The stream the dataset ``expr`` (at ``at``) may read with nothing splitting it by rank: a
    ``load_dataset(..., streaming=...)`` call whose ``streaming`` is not ``False``, ``.to_iterable_dataset()``,
    ``IterableDataset.from_generator``, a stream method of one (``.map``, ``.shuffle``...), or the construction of a
    ``torch`` ``IterableDataset`` subclass of this file whose code never reads the rank (``unsplit_iterable_class``).
    None when no value is such a stream, or some value (a branch, a reassignment) is split by rank or is another
    library's stream (WebDataset, torchdata...), which splits itself."""
    found = _stream(facts, expr, at, 0, {})
    return found if found is not SPLIT else None


def _stream(
    facts: PythonFacts, expr: cst.BaseExpression, at: cst.CSTNode, depth: int, seen: dict[int, cst.Call | None]
) -> cst.Call | None:
    """A stream among the values of ``expr``, SPLIT when a value is split by rank, else None."""
    if depth > MAX_DEPTH:
        return None
    found = None
    for origin in facts.origins(expr, at):
        node = origin.node
        if id(node) not in seen:  # met again (`ds = ds.map(...)`): its answer stands; PENDING, a cycle, adds nothing
            seen[id(node)] = PENDING
            seen[id(node)] = _origin_stream(facts, node, origin.index, depth, seen)
        value = seen[id(node)]
        if value is SPLIT:
            return SPLIT
        if value is not PENDING:
            found = found or value
    return found


def _origin_stream(
    facts: PythonFacts, node: cst.CSTNode, index: object, depth: int, seen: dict[int, cst.Call | None]
) -> cst.Call | None:
    if index is not None or not isinstance(node, cst.Call):
        return None
    if mentions_split(facts, node):
        return SPLIT
    method = facts.method_name(node)
    if method in SHARDING_CALLS - {"to_iterable_dataset"}:
        return SPLIT
    if method == "to_iterable_dataset" and isinstance(node.func, cst.Attribute):
        return SPLIT if split_by_rank(facts, node.func.value, node) else node
    if (facts.callee_is(node, LOAD_DATASET) and _may_stream(node)) or facts.callee_is(node, FROM_GENERATOR):
        return node
    if method in STREAM_METHODS and isinstance(node.func, cst.Attribute):
        return _stream(facts, node.func.value, node, depth + 1, seen)
    if unsplit_iterable_class(facts, node) is not None:
        return SPLIT if any(split_by_rank(facts, arg.value, node) for arg in node.args) else node
    return SPLIT if iterable_call(facts, node) else None


def _may_stream(call: cst.Call) -> bool:
    streaming = argument_of(call, "streaming", None)
    return streaming is not None and constant_truth(streaming) is not False


def unsplit_iterable_class(facts: PythonFacts, call: cst.Call) -> cst.ClassDef | None:
    """The class ``call`` constructs when it is a top-level class of this file deriving (through this file's
    classes only) from ``torch.utils.data.IterableDataset``, with an ``__iter__``, whose code and the file's
    functions it calls never read the rank or world size (``get_worker_info`` alone splits across a rank's loader
    workers, not across ranks). None otherwise."""
    name = get_full_name_for_node(call.func)
    cls = next((c for c in facts.classes if c.name.value == name and facts.enclosing_class(c) is None), None)
    if cls is None or not facts.derives_from(cls, TORCH_ITERABLE.__contains__):
        return None
    chain = _local_chain(facts, cls)
    if chain is None or not any(_defines(c, "__iter__") for c in chain):
        return None
    reached = [f for c in chain for inner in facts.reachable_calls(c) for f in facts.local_functions(inner)]
    if any(mentions_split(facts, node) for node in (*chain, *reached)):
        return None
    return cls


def mentions_split(facts: PythonFacts, node: cst.CSTNode) -> bool:
    """``mentions_rank``, or ``node`` reads the world size or a shard count, or calls a function that splits a
    dataset by rank (``split_dataset_by_node``, ``.shard``)."""
    if mentions_rank(facts, node):
        return True
    for part in facts.within(node, cst.Name, cst.SimpleString):
        text = part.value if isinstance(part, cst.Name) else part.value.strip("\"'")
        if text in SPLIT_NAMES or text == "WORLD_SIZE" or text in SHARDING_CALLS - {"to_iterable_dataset"}:
            return True
    return False


def _local_chain(facts: PythonFacts, cls: cst.ClassDef, depth: int = 0) -> list[cst.ClassDef] | None:
    """``cls`` and the classes of this file it derives from, when every other base is torch's IterableDataset
    or ``object``; None when a base comes from elsewhere (its code may split by rank)."""
    chain = [cls]
    for arg in cls.bases:
        names = facts.qualified_names(arg.value) | {get_full_name_for_node(arg.value) or ""}
        if not names.isdisjoint(TORCH_ITERABLE | STREAM_OBJECT_BASES):
            continue
        local = next((c for c in facts.classes if c.name.value == get_full_name_for_node(arg.value)), None)
        if local is None or local is cls or depth >= 3:
            return None
        inner = _local_chain(facts, local, depth + 1)
        if inner is None:
            return None
        chain += inner
    return chain


def _defines(cls: cst.ClassDef, method: str) -> bool:
    return any(isinstance(statement, cst.FunctionDef) and statement.name.value == method for statement in cls.body.body)
