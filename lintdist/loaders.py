"""Which DataLoader a loader expression is, whether it is given a sampler, whether a framework shards it, and how a
loop reads its batches."""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import DATALOADER_CLASSES, Origin, PythonFacts, argument_of, wrapped_iterable
from lintdist.loop import is_string_subscript, keyword

# Functions that hand the loader to a framework that shards it: accelerate, Fabric, Lightning.
FRAMEWORK_METHODS = frozenset({"prepare", "prepare_data_loader", "setup_dataloaders", "fit", "validate", "test"})
LIGHTNING_HOOKS = frozenset({"train_dataloader", "val_dataloader", "test_dataloader", "predict_dataloader"})
LIGHTNING_MODULES = ("lightning", "pytorch_lightning")
MAX_DEPTH = 6


def loader_calls(facts: PythonFacts, expr: cst.BaseExpression, at: cst.CSTNode, depth: int = 0) -> list[cst.Call]:
    """The calls an iterated loader expression comes from, looking through ``enumerate``/``tqdm``/``iter``;
    none when a value of it went through ``prepare`` (the framework's loader)."""
    origins = facts.origins(expr, at)
    if any(facts.is_prepare_call(o.node) for o in origins):
        return []
    result = []
    for origin in origins:
        node = origin.node
        if not isinstance(node, cst.Call) or origin.index is not None:
            continue
        inner = wrapped_iterable(node)
        if inner is not None and depth < MAX_DEPTH:
            result.extend(loader_calls(facts, inner, node, depth + 1))
        else:
            result.append(node)
    return result


def plain_loader(facts: PythonFacts, call: cst.Call) -> bool:
    """Whether ``call`` builds a ``DataLoader``, or a subclass of the file's that does not set up a sampler."""
    if facts.callee_is(call, DATALOADER_CLASSES):
        return True
    if not facts.is_instance_of(call, DATALOADER_CLASSES):
        return False
    name = (get_full_name_for_node(call.func) or "").rsplit(".", 1)[-1]
    return not any(
        "sampler" in node.value.lower()
        for cls in facts.classes
        if cls.name.value == name
        for node in facts.within(cls, cst.Name)
    )


def without_sampler(loader: cst.Call) -> bool:
    """Whether a loader call is given a dataset and surely no sampler or batch sampler (no ``**kwargs``)."""
    if any(arg.star for arg in loader.args):
        return False
    for name, position in (("sampler", 3), ("batch_sampler", 4)):
        value = argument_of(loader, name, position)
        if value is not None and not (isinstance(value, cst.Name) and value.value == "None"):
            return False
    return argument_of(loader, "dataset", 0) is not None


def framework_loader(facts: PythonFacts, loader: cst.Call) -> bool:
    """Whether a loader is a framework's to shard: built in a Lightning hook or module, or handed to
    ``prepare``, ``setup_dataloaders`` or ``fit`` (a method of a library, not of the script)."""
    function = facts.enclosing_function(loader)
    if function is not None and function.name.value in LIGHTNING_HOOKS:
        return True
    cls = facts.enclosing_class(loader)
    if cls is not None and facts.derives_from(cls, lambda name: name.startswith(LIGHTNING_MODULES)):
        return True
    return any(
        any(o.node is loader for arg in call.args for o in facts.origins(arg.value, call))
        for call in facts.calls
        if facts.method_name(call) in FRAMEWORK_METHODS and not facts.local_functions(call)
    )


ENUMERATE = frozenset({"builtins.enumerate", "enumerate"})
TQDM = frozenset({"tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm", "tqdm.std.tqdm", "tqdm.rich.tqdm"})


def batch_loop(facts: PythonFacts, loop: cst.For) -> tuple[str | None, cst.BaseExpression | None]:
    """The batch name and the loader a ``for`` loop reads (``for step, batch in enumerate(tqdm(loader))``);
    (None, None) when its target is not one name or the loader is passed some other way."""
    target, source = loop.target, loop.iter
    if _call_of(facts, source, ENUMERATE):
        if not (isinstance(target, cst.Tuple) and len(target.elements) == 2):
            return None, None
        target, source = target.elements[1].value, _first_argument(source)
    if _call_of(facts, source, TQDM):
        source = _first_argument(source)
    if not isinstance(target, cst.Name) or source is None:
        return None, None
    return target.value, source


def _call_of(facts: PythonFacts, expr: cst.BaseExpression, names: frozenset[str]) -> bool:
    return isinstance(expr, cst.Call) and facts.callee_is(expr, names)


def _first_argument(call: cst.Call) -> cst.BaseExpression | None:
    first = call.args[0] if call.args else None
    return first.value if first is not None and first.keyword is None and not first.star else None


def per_batch_loop(facts: PythonFacts, statement: cst.CSTNode) -> cst.For | None:
    """The ``for`` loop that runs ``statement`` once for every batch it reads: ``statement`` is a statement of
    its body, no ``continue`` before it skips a batch, and the loop (not ``async``) is a statement of a block."""
    loop = facts.parent(facts.parent(statement))
    if not (
        isinstance(loop, cst.For)
        and isinstance(loop.body, cst.IndentedBlock)
        and statement in loop.body.body
        and loop.asynchronous is None
        and isinstance(facts.parent(loop), (cst.IndentedBlock, cst.Module))
    ):
        return None
    before = loop.body.body[: loop.body.body.index(statement)]
    skips = any(facts.enclosing_loop(node) is loop for s in before for node in facts.within(s, cst.Continue))
    return None if skips else loop


def passes_batch_labels(call: cst.Call, batch: str) -> bool:
    """Whether a model call is given the labels of the batch named ``batch``: ``labels=batch["labels"]``, or
    ``**batch`` without a ``labels`` keyword."""
    labels = keyword(call, "labels")
    if labels is not None:
        return is_string_subscript(labels, '"labels"', "'labels'") and _is_name(labels.value, batch)
    return any(arg.star == "**" and _is_name(arg.value, batch) for arg in call.args)


def _is_name(expr: cst.CSTNode | None, value: str) -> bool:
    return isinstance(expr, cst.Name) and expr.value == value


def builds_dataloader(facts: PythonFacts, call: cst.Call) -> bool:
    """``DataLoader(...)`` under any alias, or a module-level subclass of this file that keeps ``DataLoader.__init__``
    (neither it nor a local class between it and ``DataLoader`` defines ``__init__``)."""
    if facts.callee_is(call, DATALOADER_CLASSES):
        return True
    if not isinstance(call.func, cst.Name):
        return False
    classes = [c for c in facts.classes if c.name.value == call.func.value and facts.enclosing_function(c) is None]
    return (
        len(classes) == 1
        and facts.derives_from(classes[0], lambda name: name in DATALOADER_CLASSES)
        and not _own_init(facts, classes[0])
    )


def _own_init(facts: PythonFacts, cls: cst.ClassDef, depth: int = 0) -> bool:
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else ()
    if any(isinstance(s, cst.FunctionDef) and s.name.value == "__init__" for s in body):
        return True
    for base in cls.bases:
        name = get_full_name_for_node(base.value)
        local = next((c for c in facts.classes if c.name.value == name and c is not cls), None)
        if local is not None and depth < 4 and _own_init(facts, local, depth + 1):
            return True
    return False


def loader_passes(facts: PythonFacts) -> list[tuple[cst.For | cst.While, cst.BaseExpression]]:
    """(loop, loader) for each loop that walks a loader: ``for b in loader`` (through ``enumerate``/``tqdm``/``iter``),
    also the first argument of a call the loop walks (a backend's ``distribute(loader)``), and a loop that calls
    ``next(it)`` on ``it = iter(loader)``."""
    found = list(facts.data_loops())
    for loop, expr in list(found):
        if isinstance(expr, cst.Call) and expr.args and not expr.args[0].keyword and not expr.args[0].star:
            found.append((loop, expr.args[0].value))
    return found + facts.iterator_passes()


# -- prepared loaders and evaluation passes ----------------------------------------------------------------------

PREPARE_LOADER_METHODS = frozenset({"prepare", "prepare_data_loader"})
# A function whose name says it evaluates.
EVALUATION_WORDS = ("eval", "valid", "test", "predict", "infer")


def prepared_origin(facts: PythonFacts, loader: cst.BaseExpression, at: cst.CSTNode) -> Origin | None:
    """The origin of ``loader`` that is accelerate's ``prepare``/``prepare_data_loader`` call (its ``index``: which
    of the call's results the loader is, None for the whole result); None when the loader is not prepared."""
    for origin in facts.origins(loader, at):
        node = origin.node
        if (
            isinstance(node, cst.Call)
            and facts.is_prepare_call(node)
            and facts.method_name(node) in PREPARE_LOADER_METHODS
        ):
            return origin
    return None


def drops_last(facts: PythonFacts, prepared: Origin) -> bool:
    """Whether the loader handed to a ``prepare`` call (``prepared``, from ``prepared_origin``) was built with
    ``drop_last=True``."""
    call = prepared.node
    args = [a for a in call.args if a.keyword is None and not a.star]
    if prepared.index is not None and prepared.index < len(args):
        given = args[prepared.index].value
    elif prepared.index is None and len(args) == 1:
        given = args[0].value
    else:
        return False
    for origin in facts.origins(given, call):
        node = origin.node
        if isinstance(node, cst.Call):
            drop = argument_of(node, "drop_last", 7 if get_full_name_for_node(node.func) == "DataLoader" else None)
            if isinstance(drop, cst.Name) and drop.value == "True":
                return True
    return False


def evaluation_function(facts: PythonFacts, node: cst.CSTNode) -> bool:
    """Whether ``node`` is in a function named for evaluation (``evaluate``, ``validation_step``, ``test``,
    ``predict``, ``infer``)."""
    function = facts.enclosing_function(node)
    return function is not None and any(word in function.name.value.lower() for word in EVALUATION_WORDS)


def eval_mode_set(facts: PythonFacts, node: cst.CSTNode, *, before: bool = False) -> bool:
    """Whether ``node``'s function (or the module, outside one) calls ``model.eval()`` (an ``eval`` with no
    argument); with ``before``, only a call that comes before ``node``."""
    function = facts.enclosing_function(node)
    return any(
        facts.method_name(call) == "eval"
        and not call.args
        and (not before or facts.index.order(call) < facts.index.order(node))
        for call in facts.calls_within(function if function is not None else facts.index.module)
    )
