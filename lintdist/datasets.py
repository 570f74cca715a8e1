"""Where a dataset comes from, and what preparing it writes that every rank would share.

A dataset value is traced back to its origin through assignments, method chains (``raw.map(...).with_format(...)``),
subscripts (``splits["train"]``), helpers' returns and parameters: read with ``datasets.load_dataset`` (by its name,
an import alias, or a variable bound to it), from local files, from a URL. The calls that download or write a cache
(``Dataset.map`` of a loaded dataset, torchvision's ``download=True``, ``torch.hub``, ``urlretrieve``, a remote
``cache_dir``) are named by the kind of shared file they write, for the questions about running them on every rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import MAX_DEPTH, RANK_GETTERS, RANK_NAMES, argument_of

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts

LOAD_DATASET = frozenset({"datasets.load_dataset", "datasets.load.load_dataset"})
DOWNLOADS = frozenset(
    {"torch.hub.load", "torch.hub.list", "torch.hub.download_url_to_file", "urllib.request.urlretrieve"}
)
HUB_LISTINGS = frozenset({"torch.hub.load", "torch.hub.list"})
DOWNLOADING_DATASET_PACKAGES = ("torchvision.datasets.", "torchaudio.datasets.")
# Dataset methods that return a dataset (so `.map` on their result still writes the same cache).
DATASET_METHODS = frozenset(
    {"map", "filter", "shuffle", "select", "select_columns", "remove_columns", "rename_column", "rename_columns"}
    | {"train_test_split", "cast", "cast_column", "class_encode_column", "flatten", "sort", "with_format"}
)
REMOTE_PREFIXES = ("http://", "https://", "hf://", "s3://", "gs://")
# Cache folders on a remote filesystem, where datasets 5.2 takes no file lock (`builder.py`: `FileLock` only when local).
REMOTE_CACHES = ("s3://", "gs://", "gcs://", "az://", "abfs://", "hf://")
LOCAL_PATHS = ("./", "../", "/", "~")


def is_load_dataset(facts: PythonFacts, call: cst.Call) -> bool:
    """Whether ``call`` calls ``datasets.load_dataset``: by its name, an import alias, or a variable or parameter
    bound to it (``loading_method = load_dataset``, ``= load_from_disk if cached else load_dataset``)."""
    if facts.callee_is(call, LOAD_DATASET):
        return True
    func = call.func
    if not isinstance(func, cst.Name) or func.value in facts.imported_names:
        return False
    if not facts.bindings(func.value, call) and facts.parameter(func.value, call) is None:
        return False
    return any(
        o.node is not func
        and isinstance(o.node, (cst.Name, cst.Attribute))
        and not LOAD_DATASET.isdisjoint(facts.qualified_names(o.node))
        for o in facts.origins(func, call)
    )


def dataset_sources(facts: PythonFacts, expr: cst.BaseExpression, at: cst.CSTNode, depth: int = 0) -> list[cst.Call]:
    """The ``load_dataset(...)`` calls a dataset expression derives from: itself, through dataset methods
    (``raw.map(...).with_format(...)``), subscripts (``splits["train"]``), names, attributes, helpers' returns and
    parameters."""
    if depth > MAX_DEPTH:
        return []
    # a subscript or a method chain descends into a smaller expression and cannot cycle: only following a name's
    # origins spends depth (`splits["train"].filter(...)` of `splits = raw.map(...).with_format(...)`)
    if isinstance(expr, cst.Subscript):
        return dataset_sources(facts, expr.value, at, depth)
    if isinstance(expr, cst.Call):
        if is_load_dataset(facts, expr):
            return [expr]
        if isinstance(expr.func, cst.Attribute) and expr.func.attr.value in DATASET_METHODS:
            return dataset_sources(facts, expr.func.value, expr, depth)
    if not isinstance(expr, (cst.Name, cst.Attribute, cst.Call)):
        return []
    return [
        source
        for o in facts.origins(expr, at)
        if o.node is not expr and isinstance(o.node, cst.BaseExpression)
        for source in dataset_sources(facts, o.node, o.node, depth + 1)
    ]


def loaded_dataset(facts: PythonFacts, expr: cst.BaseExpression, at: cst.CSTNode) -> bool:
    """Whether ``expr`` holds a dataset read with ``load_dataset`` and not streamed (or derived from one)."""
    return any(not streamed(source) for source in dataset_sources(facts, expr, at))


def streamed(call: cst.Call) -> bool:
    """Whether a ``load_dataset(...)`` call streams (``streaming=True``): it writes no cache."""
    return _is(argument_of(call, "streaming", None), "True")


def holds_url(facts: PythonFacts, expr: cst.BaseExpression | None, at: cst.CSTNode, depth: int = 0) -> bool:
    """Whether ``expr`` is or holds a URL (``"hf://..."``, ``f"https://.../{name}"``): a string, one inside a list,
    tuple, set or dict, the left of ``+``, either side of ``x if c else y``, or what a name is bound to."""
    if expr is None or depth > MAX_DEPTH:
        return False
    if isinstance(expr, (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString)):
        return string_prefix(expr).startswith(REMOTE_PREFIXES)
    if isinstance(expr, (cst.List, cst.Tuple, cst.Set, cst.Dict)):
        return any(holds_url(facts, value, at, depth + 1) for value in _element_values(expr))
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Add):
        return holds_url(facts, expr.left, at, depth + 1)
    if isinstance(expr, cst.IfExp):
        return holds_url(facts, expr.body, at, depth + 1) or holds_url(facts, expr.orelse, at, depth + 1)
    if isinstance(expr, cst.Name):
        return any(
            o.node is not expr and holds_url(facts, o.node, o.node, depth + 1)
            for o in facts.origins(expr, at)
            if isinstance(o.node, cst.BaseExpression)
        )
    return False


def reads_local_files(facts: PythonFacts, call: cst.Call) -> bool:
    """Whether a ``load_dataset(...)`` call reads local files (``data_files=``, ``data_dir=``, a ``./`` or ``/``
    path) with no URL among its arguments."""
    if any(holds_url(facts, arg.value, call) for arg in call.args):
        return False
    if argument_of(call, "data_files", 3) is not None or argument_of(call, "data_dir", 2) is not None:
        return True
    return _literal_starts_with(argument_of(call, "path", 0), LOCAL_PATHS)


def remote_cache(call: cst.Call) -> bool:
    """Whether a ``load_dataset(...)`` call caches on a remote filesystem (``cache_dir="s3://..."`` as a literal,
    ``storage_options=``), where datasets takes no file lock."""
    cache = argument_of(call, "cache_dir", None)
    return _literal_starts_with(cache, REMOTE_CACHES) or argument_of(call, "storage_options", None) is not None


def names_rank(facts: PythonFacts, expr: cst.BaseExpression | None) -> bool:
    """Whether ``expr`` reads the process's rank (``f"./data{local_rank}"``, ``urls[dist.get_rank()::n]``), so that
    each rank has its own value."""
    if expr is None:
        return False
    return any(
        (get_full_name_for_node(name) or "").rsplit(".", 1)[-1] in RANK_NAMES | RANK_GETTERS
        for name in facts.within(expr, cst.Name, cst.Attribute)
    )


def shared_preparation(facts: PythonFacts, call: cst.Call) -> str | None:
    """What shared files ``call`` writes when every rank runs it: "map" (a ``Dataset.map``/``filter`` cache of a
    loaded dataset), "torchvision" (a ``download=True`` dataset archive), "hub" (a ``torch.hub`` repository), "url" (a
    downloaded file), "remote_cache" (``load_dataset`` into a remote cache); None when nothing is shared: a per-rank
    path, a local or streamed ``load_dataset`` (datasets locks a local cache), ``keep_in_memory=True`` or
    ``load_from_cache_file=False``."""
    if is_load_dataset(facts, call):
        # no path: a local module that shadows `datasets` (the real function requires one)
        if argument_of(call, "path", 0) is None or streamed(call):
            return None
        if reads_local_files(facts, call) or names_rank(facts, argument_of(call, "cache_dir", None)):
            return None
        return "remote_cache" if remote_cache(call) else None
    names = facts.qualified_names(call.func)
    if names & DOWNLOADS:
        # `urlretrieve(url, f"shard{rank}.tar")`: each rank fetches its own file
        if any(names_rank(facts, arg.value) for arg in call.args):
            return None
        return "hub" if names & HUB_LISTINGS else "url"
    if (
        any(n.startswith(DOWNLOADING_DATASET_PACKAGES) for n in names)
        and _is(argument_of(call, "download", None), "True")
        and not names_rank(facts, argument_of(call, "root", 0))
    ):
        return "torchvision"
    if (
        facts.method_name(call) in {"map", "filter"}
        and isinstance(call.func, cst.Attribute)
        and not _is(argument_of(call, "keep_in_memory", None), "True")
        # `load_from_cache_file=False`: every rank computes its own copy whatever the order
        and not _is(argument_of(call, "load_from_cache_file", None), "False")
        and loaded_dataset(facts, call.func.value, call)
    ):
        return "map"
    return None


def string_prefix(expr: cst.BaseExpression) -> str:
    """The literal text a string starts with: all of a plain string, the text before an f-string's first
    ``{...}``, the first part of implicitly concatenated strings."""
    if isinstance(expr, cst.ConcatenatedString):
        return string_prefix(expr.left)
    if isinstance(expr, cst.SimpleString):
        value = expr.evaluated_value
        return value if isinstance(value, str) else ""
    if isinstance(expr, cst.FormattedString) and expr.parts and isinstance(expr.parts[0], cst.FormattedStringText):
        return expr.parts[0].value
    return ""


def _is(expr: cst.BaseExpression | None, constant: str) -> bool:
    """``expr`` is the constant ``True``/``False``/``None`` as written."""
    return isinstance(expr, cst.Name) and expr.value == constant


def _element_values(expr: cst.List | cst.Tuple | cst.Set | cst.Dict) -> list[cst.BaseExpression]:
    return [e.value for e in expr.elements if not isinstance(e, cst.StarredDictElement)]


def _literal_starts_with(expr: cst.BaseExpression | None, prefixes: tuple[str, ...]) -> bool:
    """A string literal (or one inside a list, tuple, set or dict) that starts with one of ``prefixes``."""
    if isinstance(expr, cst.SimpleString):
        value = expr.evaluated_value
        return isinstance(value, str) and value.startswith(prefixes)
    if isinstance(expr, (cst.List, cst.Tuple, cst.Set, cst.Dict)):
        return any(_literal_starts_with(value, prefixes) for value in _element_values(expr))
    return False
