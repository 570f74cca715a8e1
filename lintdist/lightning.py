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


# Hooks whose `self.log` defaults to `on_epoch=True` (`fx_validator.py`; the `*_epoch_end` methods of Lightning 1.x).
EPOCH_LEVEL_HOOKS = frozenset(
    {
        "validation_step",
        "test_step",
        "on_validation_batch_start",
        "on_validation_batch_end",
        "on_test_batch_start",
        "on_test_batch_end",
        "on_train_start",
        "on_validation_start",
        "on_test_start",
        "on_train_epoch_start",
        "on_train_epoch_end",
        "on_validation_epoch_start",
        "on_validation_epoch_end",
        "on_test_epoch_start",
        "on_test_epoch_end",
        "training_epoch_end",
        "validation_epoch_end",
        "test_epoch_end",
    }
)
# Hooks whose `self.log` defaults to `on_step=True, on_epoch=False`.
STEP_LEVEL_HOOKS = frozenset(
    {
        "training_step",
        "on_train_batch_start",
        "on_train_batch_end",
        "on_before_backward",
        "on_after_backward",
        "on_before_optimizer_step",
        "optimizer_step",
        "on_before_zero_grad",
        "optimizer_zero_grad",
        "configure_gradient_clipping",
        "backward",
    }
)
HELPER_DEPTH = 3


def running_hooks(
    facts: PythonFacts, method: cst.FunctionDef, depth: int = 0, seen: frozenset[int] = frozenset()
) -> set[str]:
    """The Lightning hooks (of ``EPOCH_LEVEL_HOOKS`` and ``STEP_LEVEL_HOOKS``) that run ``method``: itself, or the
    hooks of the methods that call it (``self.<name>(...)`` anywhere in the file, since a base class's helper is
    called from a subclass's hook, and the calls lintdist resolves to it), a few helpers deep."""
    from lintdist.main_process import outermost_function

    name = method.name.value
    if name in EPOCH_LEVEL_HOOKS or name in STEP_LEVEL_HOOKS:
        return {name}
    if depth >= HELPER_DEPTH or id(method) in seen:
        return set()
    sites = [call for call in facts.calls if _self_method_call(call, name)]
    sites += [site for site in facts.call_sites(method) if site not in sites]
    found: set[str] = set()
    for site in sites:
        caller = outermost_function(facts, site)
        if caller is not None:
            found |= running_hooks(facts, caller, depth + 1, seen | {id(method)})
    return found


def _self_method_call(call: cst.Call, name: str) -> bool:
    func = call.func
    return (
        isinstance(func, cst.Attribute)
        and func.attr.value == name
        and isinstance(func.value, cst.Name)
        and func.value.value == "self"
    )


def runs_on_one_device(facts: PythonFacts) -> bool:
    """Every ``Trainer(...)`` of this file runs on one device; False when there is none."""
    trainers = facts.lightning_trainers
    return bool(trainers) and all(facts.trainer_devices(call) == "one" for call in trainers)


def names_training_stage(expr: cst.BaseExpression | None) -> bool:
    """A string (or the head of an f-string) that names the training stage: ``"train_loss"``, ``f"train/{k}"``."""
    if isinstance(expr, cst.SimpleString):
        return "train" in str(expr.evaluated_value).lower()
    if isinstance(expr, cst.FormattedString) and expr.parts:
        head = expr.parts[0]
        return isinstance(head, cst.FormattedStringText) and "train" in head.value.lower()
    return False


def is_training_stage_test(test: cst.BaseExpression) -> bool:
    """A test that holds in the training stage: ``self.training``, ``stage == "train"``, ``"train" in mode``."""
    if isinstance(test, cst.Attribute) and test.attr.value == "training":
        return True
    if isinstance(test, cst.Comparison) and all(isinstance(t.operator, (cst.Equal, cst.In)) for t in test.comparisons):
        strings = [test.left, *(t.comparator for t in test.comparisons)]
        return any(isinstance(e, cst.SimpleString) and "train" in str(e.evaluated_value).lower() for e in strings)
    return False


# Values that are the same on every rank: syncing them changes nothing.
RANK_INVARIANT_LOGS = frozenset(
    {"current_epoch", "global_step", "param_groups", "get_last_lr", "lr", "learning_rate", "trainer", "epoch"}
)


def per_rank_log_value(
    facts: PythonFacts, value: cst.BaseExpression, at: cst.CSTNode, mapping: bool = False, depth: int = 0
) -> bool:
    """A value handed to ``self.log`` (``mapping``: to ``self.log_dict``) may differ between ranks and is not a
    torchmetrics object or result (which sync themselves), nor a value that is the same on every rank."""
    if depth > 3 or isinstance(value, (cst.Integer, cst.Float, cst.SimpleString, cst.FormattedString)):
        return False
    if _mentions(facts, value, RANK_INVARIANT_LOGS) or any(
        # torchmetrics' `Metric.compute()` takes no argument and returns the synced value; HF `evaluate`'s
        # `metric.compute(predictions=..., references=...)` scores this rank's data only
        facts.method_name(c) == "compute" and not c.args
        for c in [value, *facts.within(value, cst.Call)]
        if isinstance(c, cst.Call)
    ):
        return False
    if isinstance(value, cst.Attribute) and isinstance(value.value, cst.Name) and value.value.value == "self":
        return False  # `self.val_acc`: a Metric (or MetricCollection) attribute; Lightning syncs it itself
    if mapping and isinstance(value, cst.Dict):
        return any(
            isinstance(e, cst.DictElement) and per_rank_log_value(facts, e.value, at, False, depth + 1)
            for e in value.elements
        )
    if mapping and isinstance(value, cst.DictComp):
        return per_rank_log_value(facts, value.value, at, False, depth + 1)
    if isinstance(value, cst.Name):
        origins = facts.origins(value, at)
        if not origins or any(isinstance(o.node, cst.Param) for o in origins):
            return False  # a parameter: lintdist cannot say what it is
        return any(
            o.node is not value and per_rank_log_value(facts, o.node, o.node, mapping, depth + 1)
            for o in origins
            if isinstance(o.node, cst.BaseExpression)
        )
    if isinstance(value, cst.Call) and any(n.startswith("torchmetrics.") for n in facts.qualified_names(value.func)):
        # `torchmetrics.Accuracy(...)` object: syncs itself; a functional metric is a batch value
        return ".functional" in next(iter(facts.qualified_names(value.func)))
    return True


def _mentions(facts: PythonFacts, expr: cst.BaseExpression, words: frozenset[str]) -> bool:
    names = [expr] if isinstance(expr, (cst.Name,)) else []
    names += facts.within(expr, cst.Name)
    return any(isinstance(n, cst.Name) and n.value in words for n in names)


def in_training_branch(facts: PythonFacts, node: cst.CSTNode, within: cst.CSTNode) -> bool:
    """``node`` sits in the body of an ``if`` inside ``within`` that tests for the training stage (``if stage ==
    "train":``, ``if self.training:``)."""
    child = node
    for ancestor in facts.ancestors(node):
        if ancestor is within:
            return False
        if isinstance(ancestor, cst.If) and child is ancestor.body and is_training_stage_test(ancestor.test):
            return True
        child = ancestor
    return False


def accumulated_batches(trainer: cst.Call) -> str | None:
    """The literal ``accumulate_grad_batches`` above 1 a Lightning ``Trainer(...)`` is given, as written; None when
    it is given none, 1, or an expression."""
    from lintdist.facts import argument_of  # (facts imports this module)

    accumulate = argument_of(trainer, "accumulate_grad_batches", None)
    if isinstance(accumulate, cst.Integer) and int(accumulate.value) > 1:
        return accumulate.value
    return None
