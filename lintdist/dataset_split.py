"""Whether a dataset is split across ranks already: iterable or streamed, or built from the process's rank."""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.datasets import LOAD_DATASET
from lintdist.facts import RANK_GETTERS, RANK_NAMES, PythonFacts, argument_of

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
