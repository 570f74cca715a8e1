"""Which file a call writes or reads, whether the API writes it on the main process only, and what a path is.

A checkpoint is written by ``torch.save``, safetensors' ``save_file``, ``save_pretrained`` or an Accelerator's
``save``/``save_model``/``save_state``, and read back by the loading twins. A path can be matched with another by
value (``path_values``), lie in a folder only this process sees (``temporary_path``, ``in_memory``), read the rank
or the item of a loop (one file per rank or per item). The answers come from the facts' indexes (no walk of their
own).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import DATALOADER_CLASSES, argument_of

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts
    from lintdist.loop import TrainingLoop

TORCH_SAVES = frozenset({"torch.save", "torch.serialization.save"})
# Functions that write a file, with the parameter that names it (keyword, position).
WRITE_FUNCTIONS = {
    "torch.save": ("f", 1),
    "torch.serialization.save": ("f", 1),
    "safetensors.torch.save_file": ("filename", 1),
}
READ_FUNCTIONS = {
    "torch.load": ("f", 0),
    "torch.serialization.load": ("f", 0),
    "safetensors.torch.load_file": ("filename", 0),
}
# Accelerator methods that write on the main process only (`accelerate.utils.other.save` checks
# `PartialState().is_main_process`); `save_state` writes the model, optimizer and scheduler files through it.
MAIN_ONLY_WRITES = {"save": ("f", 1), "save_model": ("save_directory", 1), "save_state": ("output_dir", 0)}
ACCELERATOR_READS = {"load_state": ("input_dir", 0)}
# The names of the calls `written_file` and `read_files` accept: a cheap filter before resolving anything.
WRITE_NAMES = frozenset({"save_pretrained", "save", "save_file", *MAIN_ONLY_WRITES})
READ_NAMES = frozenset({"from_pretrained", "load", "load_file", *ACCELERATOR_READS})
# A temporary folder is each process's own: a write there never reaches another rank (a single-process test).
TEMPORARY = frozenset(
    {"tempfile.TemporaryDirectory", "tempfile.mkdtemp", "tempfile.NamedTemporaryFile", "tempfile.mkstemp"}
)
BUFFERS = frozenset({"io.BytesIO", "io.StringIO"})
# Loops over these make steps, not items: a file named after the loop variable is still one file per step.
COUNTING = frozenset({"range", "trange"})
THROUGH = frozenset({"enumerate", "tqdm", "iter"})


def written_file(facts: PythonFacts, call: cst.Call) -> tuple[cst.BaseExpression, bool] | None:
    """(the path ``call`` writes, whether the API itself writes on the main process only), or None for a call that
    writes no file lintdist knows."""
    name = facts.method_name(call)
    if name == "save_pretrained":
        path = argument_of(call, "save_directory", 0)
        flag = _keyword(call, "is_main_process")
        main_only = flag is not None and not (isinstance(flag, cst.Name) and flag.value == "True")
        return (path, main_only) if path is not None else None
    if (
        name in MAIN_ONLY_WRITES
        and isinstance(call.func, cst.Attribute)
        and facts.is_accelerator(call.func.value, call)
    ):
        path = argument_of(call, *MAIN_ONLY_WRITES[name])
        return (path, True) if path is not None else None
    if name in {"save", "save_file"}:
        path = _function_path(facts, call, WRITE_FUNCTIONS)
        return (path, False) if path is not None else None
    return None


def read_files(facts: PythonFacts, call: cst.Call) -> list[cst.BaseExpression] | None:
    """The paths ``call`` may read (``from_pretrained``'s first two positional arguments: ``PeftModel`` names the
    path second), or None for a call that reads no file lintdist knows."""
    name = facts.method_name(call)
    if name == "from_pretrained":
        named = _keyword(call, "pretrained_model_name_or_path") or _keyword(call, "model_id")
        if named is not None:
            return [named]
        return [a.value for a in call.args[:2] if a.keyword is None and not a.star] or None
    path = None
    if name in ACCELERATOR_READS and isinstance(call.func, cst.Attribute):
        if facts.is_accelerator(call.func.value, call):
            path = argument_of(call, *ACCELERATOR_READS[name])
    elif name in {"load", "load_file"}:
        path = _function_path(facts, call, READ_FUNCTIONS)
    return [path] if path is not None else None


def path_values(facts: PythonFacts, path: cst.BaseExpression, at: cst.CSTNode) -> set[str]:
    """What a path can be, by value: the texts of the expressions it can come from (a parameter nobody here passes
    stands for itself)."""
    keys = set()
    for origin in facts.origins(path, at):
        node = origin.node
        if isinstance(node, cst.Param):
            keys.add(f"parameter {id(node)}")
        elif isinstance(node, cst.BaseExpression) and not isinstance(node, (cst.Integer, cst.Float)):
            text = "".join(cst.Module([]).code_for_node(node).split())
            if text not in {"None", "True", "False"}:
                keys.add(text)
    return keys


def temporary_path(facts: PythonFacts, path: cst.BaseExpression, at: cst.CSTNode) -> bool:
    """The path lies in a temporary folder this process made (``with tempfile.TemporaryDirectory() as d``,
    ``d = tempfile.mkdtemp()``): no other process reads it."""
    names = {n.value for n in facts.within(path, cst.Name)} if facts.index.order(path) >= 0 else set()
    for origin in facts.origins(path, at):
        if isinstance(origin.node, cst.Call) and facts.callee_is(origin.node, TEMPORARY):
            return True
        if origin.node is not path and facts.index.order(origin.node) >= 0:
            names |= {n.value for n in facts.within(origin.node, cst.Name)}
    return any(
        isinstance(item.asname.name if item.asname is not None else None, cst.Name)
        and item.asname.name.value in names
        and isinstance(item.item, cst.Call)
        and facts.callee_is(item.item, TEMPORARY)
        for ancestor in facts.ancestors(at)
        if isinstance(ancestor, cst.With)
        for item in ancestor.items
    )


def in_memory(facts: PythonFacts, path: cst.BaseExpression, at: cst.CSTNode) -> bool:
    """The "path" is an in-memory buffer (``io.BytesIO()``): nothing reaches the file system."""
    return any(isinstance(o.node, cst.Call) and facts.callee_is(o.node, BUFFERS) for o in facts.origins(path, at))


def per_item_path(facts: PythonFacts, loop: TrainingLoop, path: cst.BaseExpression, at: cst.CSTNode) -> bool:
    """The path reads the variable of an enclosing loop over items that are not steps or batches (``for image_path
    in image_paths:``): each item gets its own file, so ranks do not write the same one."""
    reads = {n.value for n in facts.within(path, cst.Name)} | ({path.value} if isinstance(path, cst.Name) else set())
    for name in list(reads):
        for binding in facts.bindings(name, at):
            reads |= {n.value for n in facts.within(binding.value, cst.Name)}
    for ancestor in facts.ancestors(at):
        if not isinstance(ancestor, cst.For):
            continue
        targets = {n.value for n in facts.within(ancestor.target, cst.Name)}
        if isinstance(ancestor.target, cst.Name):
            targets.add(ancestor.target.value)
        if not targets & reads:
            continue
        core = ancestor.iter
        while isinstance(core, cst.Call) and core.args and _last_name(core.func) in THROUGH:
            core = core.args[0].value
        if isinstance(core, cst.Call) and (get_full_name_for_node(core.func) or "") in COUNTING:
            continue
        if not _loader(facts, loop, core, ancestor):
            return True
    return False


def _loader(facts: PythonFacts, loop: TrainingLoop, expr: cst.BaseExpression, at: cst.CSTNode) -> bool:
    if "loader" in (get_full_name_for_node(expr) or "").lower():
        return True
    return any(
        isinstance(o.node, cst.Call)
        and (facts.callee_is(o.node, DATALOADER_CLASSES) or loop.is_accelerate_prepare(o.node))
        for o in facts.origins(expr, at)
    )


def _function_path(facts: PythonFacts, call: cst.Call, table: dict[str, tuple[str, int]]) -> cst.BaseExpression | None:
    qualified = next((q for q in facts.qualified_names(call.func) if q in table), None)
    return argument_of(call, *table[qualified]) if qualified is not None else None


def _keyword(call: cst.Call, keyword: str) -> cst.BaseExpression | None:
    return next((a.value for a in call.args if a.keyword is not None and a.keyword.value == keyword), None)


def _last_name(func: cst.BaseExpression) -> str:
    return (get_full_name_for_node(func) or "").rsplit(".", 1)[-1]


def saved_on_main_only(facts: PythonFacts, argument: cst.Arg) -> bool:
    """``argument`` is the object of an Accelerator's ``save(obj, path)``, which writes it on the main process only."""
    call = facts.parent(argument)
    if not isinstance(call, cst.Call) or facts.method_name(call) != "save" or argument is not call.args[0]:
        return False
    return isinstance(call.func, cst.Attribute) and facts.is_accelerator(call.func.value, call)


def file_writes(facts: PythonFacts) -> list[tuple[cst.Call, cst.BaseExpression, bool]]:
    """Every call of the file that writes a file lintdist knows (``written_file``): the call, the path, and whether
    the API writes on the main process only, in the order of the file."""
    return [
        (call, *found)
        for call in facts.calls
        if facts.method_name(call) in WRITE_NAMES and (found := written_file(facts, call)) is not None
    ]


def file_reads(facts: PythonFacts) -> list[tuple[cst.Call, list[cst.BaseExpression]]]:
    """Every call of the file that reads a file lintdist knows (``read_files``), with the paths it may read, in the
    order of the file."""
    return [
        (call, found)
        for call in facts.calls
        if facts.method_name(call) in READ_NAMES and (found := read_files(facts, call)) is not None
    ]
