"""Lightning in a script: which classes are LightningModules, and on how many devices its Trainers run.

Rules about Lightning ask these of the facts (``PythonFacts.lightning_module_of``, ``is_lightning_module``,
``lightning_trainers`` and ``trainer_devices``) instead of keeping their own lists of where Lightning's classes
live. The answers come from the facts' indexes (no walk of their own).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
from libcst.helpers import get_full_name_for_node

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts

# Where `LightningModule` can be imported from (`lightning`, the 1.x `pytorch_lightning`, their submodules).
LIGHTNING_MODULES = frozenset(
    f"{home}.LightningModule"
    for home in (
        "lightning",
        "lightning.pytorch",
        "lightning.pytorch.core",
        "lightning.pytorch.core.module",
        "pytorch_lightning",
        "pytorch_lightning.core",
        "pytorch_lightning.core.module",
        "pytorch_lightning.core.lightning",
    )
)


def is_lightning_module(facts: PythonFacts, cls: cst.ClassDef) -> bool:
    """``cls`` derives from Lightning's ``LightningModule``, directly or through classes of this file."""
    return facts.derives_from(cls, LIGHTNING_MODULES.__contains__)


def lightning_module_of(facts: PythonFacts, node: cst.CSTNode) -> cst.ClassDef | None:
    """The LightningModule whose method ``node`` is in (a function nested in the method too); None elsewhere."""
    function = facts.enclosing_function(node)
    cls = facts.enclosing_class(function) if function is not None else None
    return cls if cls is not None and is_lightning_module(facts, cls) else None


# `strategy=` strings that start one process per device.
MULTI_DEVICE_STRATEGIES = ("ddp", "fsdp", "deepspeed")


def trainer_devices(facts: PythonFacts, trainer: cst.Call) -> str | None:
    """How many devices a ``Trainer(...)`` call runs on, from its arguments: "one", "several" or None (unknown).

    One: ``num_nodes`` 1 or absent and ``devices`` at most one wherever its value comes from (``1``, ``"1"``,
    ``[0]``, ``min(1, n)``), or no ``devices`` with ``accelerator="cpu"``/``"mps"`` (``"auto"`` is one device
    there), and no ``**kwargs`` that could say otherwise. Several: ``num_nodes`` or ``devices`` above one, or else a
    ``ddp``/``fsdp``/``deepspeed`` strategy string (it runs a process per device)."""
    nodes = _keyword(trainer, "num_nodes")
    devices = _keyword(trainer, "devices")
    node_count = _count(nodes) if nodes is not None else 1
    counts = [None]
    if devices is not None:
        origins = facts.origins(devices, trainer)
        counts = [_count(o.node) if o.index is None else None for o in origins] or [None]
    if (node_count or 0) > 1 or all(c is not None and c > 1 for c in counts):
        return "several"
    if not any(arg.star for arg in trainer.args) and node_count == 1:
        if devices is not None and all(c is not None and c <= 1 for c in counts):
            return "one"
        if devices is None and _literal(_keyword(trainer, "accelerator")) in {"cpu", "mps"}:
            return "one"
    strategy = _literal(_keyword(trainer, "strategy"))
    if isinstance(strategy, str) and any(word in strategy for word in MULTI_DEVICE_STRATEGIES):
        return "several"
    return None


def _keyword(call: cst.Call, name: str) -> cst.BaseExpression | None:
    return next((arg.value for arg in call.args if arg.keyword is not None and arg.keyword.value == name), None)


def _count(node: cst.CSTNode) -> int | None:
    """The number of devices (or nodes) a literal asks for: ``2``, ``"2"``, ``[0, 1]``, ``min(1, n)``."""
    value = _literal(node)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    if isinstance(node, (cst.List, cst.Tuple)) and not any(isinstance(e, cst.StarredElement) for e in node.elements):
        return len(node.elements)
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "min":
        return 1 if any(_literal(arg.value) in {0, 1} for arg in node.args) else None
    return None


def _literal(expr: cst.CSTNode | None) -> object:
    if isinstance(expr, cst.Integer):
        return expr.evaluated_value
    if isinstance(expr, cst.SimpleString):
        return expr.evaluated_value
    return None


def fitting_trainers(facts: PythonFacts, cls: cst.ClassDef) -> list[cst.Call]:
    """The ``Trainer(...)`` calls that fit the LightningModule ``cls`` (``trainer.fit(Model(...))``); the file's one
    Trainer when no ``fit`` call links one."""
    trainers = facts.lightning_trainers
    linked = []
    for call in facts.calls:
        if facts.method_name(call) != "fit" or not call.args or not isinstance(call.func, cst.Attribute):
            continue
        fitted = [o.node for o in facts.origins(call.args[0].value, call)]
        if any(isinstance(n, cst.Call) and get_full_name_for_node(n.func) == cls.name.value for n in fitted):
            linked.extend(o.node for o in facts.origins(call.func.value, call) if o.node in trainers)
    return linked or (trainers if len(trainers) == 1 else [])


def returned_loss(returned: cst.BaseExpression) -> cst.BaseExpression | None:
    """The loss Lightning takes from what a ``training_step`` returns: the value itself, or a dict's ``"loss"``
    (None when the dict has no such literal key)."""
    if not isinstance(returned, cst.Dict):
        return returned
    return next(
        (
            e.value
            for e in returned.elements
            if isinstance(e, cst.DictElement)
            and isinstance(e.key, cst.SimpleString)
            and e.key.evaluated_value == "loss"
        ),
        None,
    )


# Lightning's DeepSpeed strategy, under its import homes.
DEEPSPEED_STRATEGIES = frozenset(
    {
        "lightning.pytorch.strategies.DeepSpeedStrategy",
        "pytorch_lightning.strategies.DeepSpeedStrategy",
        "lightning.fabric.strategies.DeepSpeedStrategy",
    }
)
FP16_PRECISIONS = frozenset({"16", "16-mixed", "fp16"})


def optimizes_manually(facts: PythonFacts, cls: cst.ClassDef) -> bool:
    """The LightningModule turns automatic optimization off: ``self.automatic_optimization = False`` in a method, or
    the class attribute."""
    for assign in facts.within(cls, cst.Assign):
        if not (isinstance(assign.value, cst.Name) and assign.value.value == "False"):
            continue
        for target in assign.targets:
            if get_full_name_for_node(target.target) in {"self.automatic_optimization", "automatic_optimization"}:
                return True
    return False


def scales_loss(facts: PythonFacts) -> bool:
    """A Lightning Trainer of this file runs with fp16 mixed precision or a DeepSpeed strategy, whose backward
    (``manual_backward``) scales the loss or hands it to the engine."""
    if any(facts.callee_is(call, DEEPSPEED_STRATEGIES) for call in facts.calls):
        return True
    for trainer in facts.lightning_trainers:
        precision = _literal(_keyword(trainer, "precision"))
        if precision is not None and str(precision) in FP16_PRECISIONS:
            return True
        strategy = _literal(_keyword(trainer, "strategy"))
        if isinstance(strategy, str) and strategy.startswith("deepspeed"):
            return True
    return False
