"""What goes through an Accelerator's ``prepare``, and what the ``Accelerator(...)`` behind it was built with.

Launch settings (``lintdist.launch``) merge every spelling of a setting across the file and its launch; some
questions are about one Accelerator: the one whose ``prepare`` handled a value. Its keywords are read where it is
built, through ``dataloader_config=DataLoaderConfiguration(...)`` and through a ``**kwargs`` dict of this file whose
keys are all known (its literal keys and ``kwargs["key"] = ...`` stores), as the ``no_trainer`` examples build
their logging keywords.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import ACCELERATOR_CLASSES, argument_of, string_key, string_value

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts

PREPARE_METHODS = frozenset({"prepare", "prepare_scheduler"})
# Options an Accelerator takes inside one of its configuration objects: option -> (carrying keyword, position in
# the configuration's constructor). Only these spellings are read: accelerate 1.x ignores ``Accelerator(
# split_batches=...)``.
CARRIED = {
    "split_batches": ("dataloader_config", 0),
    "dispatch_batches": ("dataloader_config", 1),
    "even_batches": ("dataloader_config", 2),
}
# What accelerate uses when nothing says (``Accelerator.__init__``, ``DataLoaderConfiguration``).
DEFAULTS = {"step_scheduler_with_optimizer": True, "split_batches": False, "even_batches": True}
READ_METHODS = frozenset({"get", "items", "keys"})
LITERALS = {"True": True, "False": False, "None": None}


def prepared_arguments(facts: PythonFacts) -> Iterator[tuple[cst.Call, cst.BaseExpression, str | None]]:
    """(prepare call, argument, full name the prepared value is bound to) for each positional argument of
    ``accelerator.prepare(...)`` and ``accelerator.prepare_scheduler(...)``; no name unless the result is unpacked
    into as many targets (or one ``x = ...`` for one argument)."""
    for call in facts.calls:
        func = call.func
        if not isinstance(func, cst.Attribute) or func.attr.value not in PREPARE_METHODS:
            continue
        if not facts.accelerator_like(func.value, call):
            continue
        positional = [arg for arg in call.args if arg.keyword is None]
        if any(arg.star for arg in positional):
            continue
        targets = assigned_targets(facts, call)
        for index, arg in enumerate(positional):
            target = None
            if targets is not None and len(targets) == len(positional):
                target = get_full_name_for_node(targets[index])
            yield call, arg.value, target


def assigned_targets(facts: PythonFacts, call: cst.Call) -> list[cst.BaseExpression] | None:
    """The targets a call's result is unpacked into (``a, b = call``), ``[x]`` for ``x = call``, else None."""
    parent = facts.parent(call)
    if not isinstance(parent, cst.Assign) or parent.value is not call or len(parent.targets) != 1:
        return None
    target = parent.targets[0].target
    if isinstance(target, (cst.Tuple, cst.List)):
        return [element.value for element in target.elements]
    return [target]


def accelerator_calls(facts: PythonFacts, receiver: cst.BaseExpression, at: cst.CSTNode) -> list[cst.Call]:
    """The ``Accelerator(...)`` constructions ``receiver`` may hold at ``at``."""
    return [
        origin.node
        for origin in facts.origins(receiver, at)
        if isinstance(origin.node, cst.Call) and facts.callee_is(origin.node, ACCELERATOR_CLASSES)
    ]


def accelerator_option(facts: PythonFacts, accelerator: cst.Call, name: str) -> object:
    """The literal value (True, False, None) an ``Accelerator(...)`` call gives option ``name``, accelerate's
    default when nothing sets it, or ``UNKNOWN`` when an expression, ``*args``, a ``**kwargs`` that may hold it or a
    configuration lintdist cannot read decides."""
    carrier, position = CARRIED.get(name, (name, None))
    if any(arg.star == "*" for arg in accelerator.args):
        return UNKNOWN
    if any(arg.star == "**" and _may_hold(facts, arg.value, accelerator, {name, carrier}) for arg in accelerator.args):
        return UNKNOWN
    value = argument_of(accelerator, carrier, None)
    if value is None:
        return DEFAULTS.get(name)
    if position is None:
        return _literal(value)
    found = set()
    for origin in facts.origins(value, accelerator):
        config = origin.node
        if not isinstance(config, cst.Call) or any(arg.star for arg in config.args):
            return UNKNOWN  # a configuration lintdist cannot read
        inner = argument_of(config, name, position)
        found.add(DEFAULTS.get(name) if inner is None else _literal(inner))
    if not found:
        return DEFAULTS.get(name)
    return found.pop() if len(found) == 1 else UNKNOWN


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = _Unknown()


def _literal(expr: cst.BaseExpression) -> object:
    return LITERALS.get(expr.value, UNKNOWN) if isinstance(expr, cst.Name) else UNKNOWN


def _may_hold(facts: PythonFacts, kwargs: cst.BaseExpression, at: cst.CSTNode, keys: set[str]) -> bool:
    """``**kwargs`` may give one of ``keys``: unless it is a dict of this file whose keys are all known."""
    key = get_full_name_for_node(kwargs)
    # the dict's own assignments (`kwargs[...] = v` is bound under the dict's name too: its keys are read below)
    bindings = [b for b in facts.bindings(key, at) if not _subscript_target(b)] if key else []
    if not bindings:
        return True
    found: set[str | None] = set()
    for binding in bindings:
        for origin in facts.origins(binding.value, binding.statement):
            node = origin.node
            if isinstance(node, cst.Dict):
                found |= {string_value(e.key) if isinstance(e, cst.DictElement) else None for e in node.elements}
            elif not (isinstance(node, cst.Call) and get_full_name_for_node(node.func) == "dict" and not node.args):
                return True
    for name in facts.within(facts.enclosing_function(at) or facts.index.module, cst.Name, cst.Attribute):
        if get_full_name_for_node(name) != key:
            continue
        parent = facts.parent(name)
        if isinstance(parent, cst.Subscript) and parent.value is name:
            found.add(string_key(parent))
        elif isinstance(parent, cst.Attribute) and parent.value is name and parent.attr.value not in READ_METHODS:
            return True  # `kwargs.update(...)`, `kwargs.setdefault(...)`
    return bool(found & (keys | {None}))


def _subscript_target(binding) -> bool:
    statement = binding.statement
    targets = [t.target for t in statement.targets] if isinstance(statement, cst.Assign) else [statement.target]
    return any(isinstance(t, cst.Subscript) for t in targets)


IMPORTS_ACCELERATE = re.compile(r"^\s*(?:from|import)\s+accelerate\b", re.MULTILINE)
PREPARE_LOADER_FUNCTIONS = frozenset({"accelerate.data_loader.prepare_data_loader"})


def accelerator_receiver(facts: PythonFacts, receiver: cst.BaseExpression, at: cst.CSTNode, text: str) -> bool:
    """``receiver`` holds an Accelerator, or (its origin out of sight) is named ``...accelerator`` in a script whose
    source ``text`` imports accelerate."""
    if facts.is_accelerator(receiver, at):
        return True
    name = (get_full_name_for_node(receiver) or "").rsplit(".", 1)[-1]
    return name.endswith("accelerator") and IMPORTS_ACCELERATE.search(text) is not None


def prepared_loaders(facts: PythonFacts, call: cst.Call, text: str) -> list[cst.BaseExpression]:
    """The arguments a call hands to accelerate to shard as loaders: every positional one of
    ``accelerator.prepare(...)``, the loader of ``prepare_data_loader(...)`` (function or method); none for another
    call."""
    if facts.callee_is(call, PREPARE_LOADER_FUNCTIONS):
        loader = argument_of(call, "dataloader", 0)
        return [loader] if loader is not None else []
    func = call.func
    if not isinstance(func, cst.Attribute) or func.attr.value not in ("prepare", "prepare_data_loader"):
        return []
    if not accelerator_receiver(facts, func.value, call, text):
        return []
    if func.attr.value == "prepare":
        return [arg.value for arg in call.args if arg.keyword is None and not arg.star]
    loader = argument_of(call, "data_loader", 0)
    return [loader] if loader is not None else []


def even_batches_off(facts: PythonFacts, settings) -> bool:
    """Whether anything turns accelerate's ``even_batches`` padding off: the launch or code settings
    (``DataLoaderConfiguration(even_batches=False)``), an ``x.even_batches = ...`` store of anything but ``True``,
    or ``join_uneven_inputs(..., even_batches=...)`` given anything but ``True``. An unknown value counts as off."""
    from lintdist.launch import switched_on

    if "even_batches_off" in facts._memo:
        return facts._memo["even_batches_off"]
    setting = settings.get("even_batches") if settings is not None else None
    found = setting is not None and not switched_on(setting)
    for statement in facts.index.nodes(cst.Assign) if not found else ():
        if any(
            isinstance(t.target, cst.Attribute) and t.target.attr.value == "even_batches" for t in statement.targets
        ):
            found = found or _literal(statement.value) is not True
    for call in facts.calls if not found else ():
        even = argument_of(call, "even_batches", 1) if facts.method_name(call) == "join_uneven_inputs" else None
        found = found or (even is not None and _literal(even) is not True)
    facts._memo["even_batches_off"] = found
    return found


def accelerator_methods(facts: PythonFacts, node: cst.CSTNode) -> list[cst.Call]:
    """The calls inside ``node`` of a method of an accelerator (``accelerator.backward(loss)``,
    ``self.accelerator.gather(x)``)."""
    return [
        call
        for call in facts.calls_within(node)
        if isinstance(call.func, cst.Attribute)
        and isinstance(call.func.value, (cst.Name, cst.Attribute))
        and facts.accelerator_like(call.func.value, call)
    ]


def accelerator_spelling(facts: PythonFacts, at: cst.CSTNode) -> str | None:
    """How the accelerator is spelled where ``at`` is (``accelerator``, ``self.accelerator``): the receiver of an
    accelerator method called in ``at``'s function, else in the module's own statements (outside functions)."""
    function = facts.enclosing_function(at)
    calls = accelerator_methods(facts, function) if function is not None else []
    calls += [c for c in accelerator_methods(facts, facts.index.module) if facts.enclosing_function(c) is None]
    for call in calls:
        name = get_full_name_for_node(call.func.value)
        if name and not name.startswith("torch."):
            return name
    return None


# Options accelerate reads only from ``dataloader_config=DataLoaderConfiguration(...)`` since 1.0, though older
# releases took them as ``Accelerator(...)`` keywords (accelerate 1.15 ``Accelerator.__init__``).
DATALOADER_OPTIONS = ("split_batches", "dispatch_batches", "even_batches", "use_seedable_sampler")


def loose_dataloader_keywords(accelerator: cst.Call) -> list[cst.Arg]:
    """The keyword arguments of an ``Accelerator(...)`` call that name a data-loader option outside
    ``DataLoaderConfiguration``, in the call's order."""
    return [arg for arg in accelerator.args if arg.keyword is not None and arg.keyword.value in DATALOADER_OPTIONS]


def dataloader_keys_in_kwargs(facts: PythonFacts, accelerator: cst.Call) -> list[cst.CSTNode]:
    """The keys naming a data-loader option in the dicts of this file that an ``Accelerator(**kwargs)`` call
    unpacks: ``dict(option=...)`` keywords and ``{"option": ...}`` keys (not ``kwargs["option"] = ...`` stores,
    which scripts guard by the installed signature)."""
    found: list[cst.CSTNode] = []
    for arg in accelerator.args:
        if arg.star != "**":
            continue
        for origin in facts.origins(arg.value, accelerator):
            node = origin.node
            if isinstance(node, cst.Dict):
                found += [
                    e.key
                    for e in node.elements
                    if isinstance(e, cst.DictElement) and string_value(e.key) in DATALOADER_OPTIONS
                ]
            elif isinstance(node, cst.Call) and get_full_name_for_node(node.func) == "dict":
                found += [a for a in node.args if a.keyword is not None and a.keyword.value in DATALOADER_OPTIONS]
    return found
