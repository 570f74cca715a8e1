"""What a count of steps counts: each rank's batches, all batches, or a budget the training loop stops on, and the
power of the number of processes it carries.

``epochs * len(loader)`` counts each rank's batches when ``loader`` went through ``accelerator.prepare`` or samples
with a ``DistributedSampler``, and all batches (one factor of the number of processes more) for a ``DataLoader``
before ``prepare``; ``accelerator.num_processes``, ``dist.get_world_size()``, ``os.environ["WORLD_SIZE"]`` are a
factor of the number of processes; a name the training loop stops on (``if step >= args.max_steps: break``) is a
count of optimizer steps. ``StepCounts.evaluate`` follows names through the assignments that reach a point and
parameters through the calls of the file, and answers every way the expression may evaluate.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import DATALOADER_CLASSES, SAMPLER_CLASSES, argument_of, string_value
from lintdist.reaching import reaching_bindings

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts

# `lintdist.runtime.scheduler_total_steps(n, accelerator)`: n times the number of processes.
TOTAL_STEPS = frozenset({"lintdist.runtime.scheduler_total_steps", "lintdist.runtime.loop.scheduler_total_steps"})
PASS_THROUGH = frozenset({"int", "float", "round", "abs", "math.ceil", "math.floor", "math.trunc"})
# A count of data-parallel processes: `accelerator.num_processes`, `dist.get_world_size()`, `args.world_size`...
WORLD = re.compile(
    r"(?:num_processes|world_size|num_replicas|n_?gpus?|num_gpus|num_devices|nprocs?|nproc_per_node|dp_size"
    r"|data_parallel_size|dp_world_size)$",
    re.IGNORECASE,
)
MAX_DEPTH = 8
MAX_PATHS = 16


@dataclass(frozen=True)
class Count:
    """One way an expression may evaluate: whether it is a count of steps, the power of W (the number of processes)
    it carries relative to a count of optimizer steps, and why it is a count."""

    count: bool = False
    world: int = 0
    unknown: bool = False
    why: str = ""
    # the loop test that makes a name a count of optimizer steps (its line is put in words only for a message)
    where: cst.CSTNode | None = field(default=None, compare=False)

    @property
    def optimizer_steps(self) -> bool:
        """A count of optimizer steps without a factor of the number of processes."""
        return self.count and not self.unknown and self.world <= 0


NEUTRAL = Count()
UNKNOWN = Count(unknown=True)
WORLD_FACTOR = Count(world=1)


class StepCounts:
    """What step-count expressions of one file evaluate to. ``bound(key)`` names the loop test that makes the
    value of ``key`` a count of optimizer steps (the training loop stops on it), or None."""

    def __init__(self, facts: PythonFacts, bound: Callable[[str], cst.CSTNode | None]) -> None:
        self.facts = facts
        self.bound = bound

    def evaluate(self, expr: cst.BaseExpression, at: cst.CSTNode, depth: int = 0) -> list[Count]:
        """The ways ``expr`` (at ``at``) may evaluate (at most MAX_PATHS; ``UNKNOWN`` among them where lintdist
        cannot tell)."""
        if depth > MAX_DEPTH:
            return [UNKNOWN]
        if isinstance(expr, (cst.Integer, cst.Float)):
            return [NEUTRAL]
        if isinstance(expr, (cst.Name, cst.Attribute)):
            return self._name(expr, at, depth)
        if isinstance(expr, cst.Subscript):
            return [WORLD_FACTOR] if _world_subscript(expr) else [NEUTRAL]
        if isinstance(expr, cst.UnaryOperation):
            return self.evaluate(expr.expression, at, depth + 1)
        if isinstance(expr, cst.IfExp):
            return _cap(self.evaluate(expr.body, at, depth + 1) + self.evaluate(expr.orelse, at, depth + 1))
        if isinstance(expr, cst.BinaryOperation):
            left = self.evaluate(expr.left, at, depth + 1)
            right = self.evaluate(expr.right, at, depth + 1)
            return _cap([_combine(expr.operator, a, b) for a in left for b in right])
        if isinstance(expr, cst.Call):
            return self._call(expr, at, depth)
        return [UNKNOWN]

    def _call(self, call: cst.Call, at: cst.CSTNode, depth: int) -> list[Count]:
        facts = self.facts
        positional = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
        if isinstance(call.func, cst.Name) and call.func.value == "len" and len(positional) == 1:
            return [loader_length(facts, positional[0], at)]
        if WORLD.search(facts.method_name(call) or ""):
            return [WORLD_FACTOR]
        names = facts.qualified_names(call.func)
        if names & TOTAL_STEPS and positional:
            return [replace(v, world=v.world + 1) for v in self.evaluate(positional[0], at, depth + 1)]
        simple = get_full_name_for_node(call.func) or ""
        if (names & PASS_THROUGH or simple in PASS_THROUGH) and positional:
            return self.evaluate(positional[0], at, depth + 1)
        if simple in {"max", "min"} and positional:
            return _cap([v for arg in positional for v in self.evaluate(arg, at, depth + 1)])
        return [UNKNOWN]

    def _name(self, expr: cst.Name | cst.Attribute, at: cst.CSTNode, depth: int) -> list[Count]:
        key = get_full_name_for_node(expr)
        if WORLD.search(expr.attr.value if isinstance(expr, cst.Attribute) else expr.value):
            return [WORLD_FACTOR]
        if key is None:
            return [NEUTRAL]
        bindings, falls_through = reaching_bindings(self.facts, key, at)
        values: list[Count] = []
        if falls_through or not bindings:
            # the value from before (a parsed option, an argument, a config field): a count of optimizer steps
            # when the training loop stops on it; a parameter: what the calls of this file pass
            passed = self._passed(expr, at, depth) if isinstance(expr, cst.Name) else []
            values.extend(passed or [self._leaf(key)])
        for binding in bindings:
            if binding.index is not None:
                values.append(UNKNOWN)
            else:
                values.extend(self.evaluate(binding.value, binding.statement, depth + 1))
        values = _cap(values)
        if values and not any(v.count or v.unknown for v in values):
            # assigned a constant (`max_steps = 1000`) or an option that the training loop stops on
            values = [self._leaf(key)]
        return values

    def _passed(self, name: cst.Name, at: cst.CSTNode, depth: int) -> list[Count]:
        """What the calls of this file pass for the parameter ``name``."""
        facts = self.facts
        found = facts.parameter(name.value, at)
        if found is None:
            return []
        function, index, _ = found
        values: list[Count] = []
        for call in facts.call_sites(function):
            argument = facts.argument_for(call, function, name.value, index)
            values.extend(self.evaluate(argument, call, depth + 1) if argument is not None else [NEUTRAL])
        return _cap(values)

    def _leaf(self, key: str) -> Count:
        bound = self.bound(key)
        if bound is None:
            return NEUTRAL
        return Count(count=True, why=f"`{key}` bounds the training loop", where=bound)


def loader_length(facts: PythonFacts, loader: cst.BaseExpression, at: cst.CSTNode) -> Count:
    """``len(loader)``: a count of each rank's batches (a prepared loader, or one with a ``DistributedSampler``: W
    power 0), of all batches (a ``DataLoader`` before ``prepare``: W power 1), or unknown."""
    name = get_full_name_for_node(loader) or "the loader"
    values = {
        "prepared": Count(count=True, why=f"the length of the prepared loader `{name}`"),
        "sharded": Count(count=True, why=f"the length of `{name}`, which a `DistributedSampler` shards"),
        "unsharded": Count(count=True, world=1),
    }
    key = get_full_name_for_node(loader) if isinstance(loader, (cst.Name, cst.Attribute)) else None
    kinds: set[str] = set()
    function = facts.enclosing_function(at)
    if key and any(b.function is function for b in facts.bindings(key, at)):
        # assigned in this function: what the last assignments before `at` made (nothing yet: unknown)
        bindings, falls_through = reaching_bindings(facts, key, at)
        if falls_through or not bindings:
            return UNKNOWN
        for binding in bindings:
            if binding.index is not None:
                prepared = isinstance(binding.value, cst.Call) and facts.is_prepare_call(binding.value)
                kinds.add("prepared" if prepared else "unknown")
            else:
                kinds |= {loader_sharding(facts, o.node) for o in facts.origins(binding.value, binding.statement)}
    else:
        kinds = {loader_sharding(facts, o.node) for o in facts.origins(loader, at)}
    return values.get(kinds.pop(), UNKNOWN) if len(kinds) == 1 else UNKNOWN


def loader_sharding(facts: PythonFacts, node: cst.CSTNode) -> str:
    """How a loader construction splits the data between ranks: "prepared" (``accelerator.prepare``), "sharded"
    (a ``DataLoader`` with a ``DistributedSampler``, also inside its sampler), "unsharded" (another ``DataLoader``),
    or "unknown"."""
    if not isinstance(node, cst.Call):
        return "unknown"
    if facts.is_prepare_call(node):
        return "prepared"
    if not facts.is_instance_of(node, DATALOADER_CLASSES, "DataLoader"):
        return "unknown"
    is_dataloader = facts.is_instance_of(node, DATALOADER_CLASSES)
    for keyword, position in (("sampler", 3), ("batch_sampler", 4)):
        argument = argument_of(node, keyword, position if is_dataloader else None)
        for origin in facts.origins(argument, node) if argument is not None else ():
            sampler = origin.node
            if not isinstance(sampler, cst.Call):
                continue
            inner = argument_of(sampler, "sampler", 0)
            samplers = [sampler] + ([o.node for o in facts.origins(inner, sampler)] if inner is not None else [])
            if any(
                isinstance(s, cst.Call) and facts.is_instance_of(s, SAMPLER_CLASSES, "DistributedSampler")
                for s in samplers
            ):
                return "sharded"
    return "unsharded"


def _combine(operator: cst.BaseBinaryOp, a: Count, b: Count) -> Count:
    if a.unknown or b.unknown:
        return UNKNOWN
    # the reason to show: a loader's length before a loop bound (`epochs * len(loader)` counts the loader)
    source = a if (a.why and (a.where is None or not b.why or b.where is not None)) or not b.why else b
    if isinstance(operator, cst.Multiply):
        return Count(count=a.count or b.count, world=a.world + b.world, why=source.why, where=source.where)
    if isinstance(operator, (cst.Divide, cst.FloorDivide)):
        return Count(count=a.count, world=a.world - b.world, why=a.why, where=a.where)
    if isinstance(operator, (cst.Add, cst.Subtract)):
        if a.count and b.count:
            return a if a.world == b.world else UNKNOWN
        if a.count or b.count:
            return a if a.count else b
        return Count(world=max(a.world, b.world))
    return UNKNOWN


def _cap(values: list[Count]) -> list[Count]:
    unique = list(dict.fromkeys(values))
    return unique if len(unique) <= MAX_PATHS else [UNKNOWN]


def _world_subscript(expr: cst.Subscript) -> bool:
    """``os.environ["WORLD_SIZE"]``."""
    if len(expr.slice) != 1 or not isinstance(expr.slice[0].slice, cst.Index):
        return False
    return string_value(expr.slice[0].slice.value) == "WORLD_SIZE"


def read_scaled(counts: StepCounts, node: cst.BaseExpression, at: cst.CSTNode) -> bool:
    """``node`` is read through ``scheduler_total_steps(node, ...)`` or times a count of processes (``total *
    accelerator.num_processes``, evaluated at ``at``)."""
    facts = counts.facts
    parent = facts.parent(node)
    if isinstance(parent, cst.Arg):
        call = facts.parent(parent)
        return isinstance(call, cst.Call) and bool(facts.qualified_names(call.func) & TOTAL_STEPS)
    if isinstance(parent, cst.BinaryOperation) and isinstance(parent.operator, cst.Multiply):
        other = parent.right if parent.left is node else parent.left
        return any(v.world >= 1 for v in counts.evaluate(other, at))
    return False


def unscaled_count(values: list[Count]) -> tuple[Count | None, bool]:
    """The first of ``values`` that counts optimizer steps without a factor of the processes (None when none
    does), and whether another of them is something else (a count given or derived, only one way unscaled)."""
    found = next((v for v in values if v.optimizer_steps), None)
    return found, found is not None and not all(v.optimizer_steps for v in values)
