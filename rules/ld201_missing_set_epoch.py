"""LD201 missing-set-epoch: a DistributedSampler iterated every epoch but never told which one."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
from libcst.helpers import get_full_name_for_node
from libcst.metadata import GlobalScope, ScopeProvider

from lintdist.facts import DATALOADER_CLASSES, SAMPLER_CLASSES, Loop, argument_of
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Rule, Valid

ITERATION_WRAPPERS = frozenset({"enumerate", "tqdm", "iter", "trange"})
BACKWARD_METHODS = frozenset({"backward", "manual_backward"})
MAX_CALLER_DEPTH = 3


@dataclass(frozen=True)
class SamplerUse:
    sampler: cst.Call  # the DistributedSampler(...) call
    sampler_arg: cst.BaseExpression  # what the loader was given as its sampler
    loader: cst.Call
    certain: bool  # shuffle is known to be on


class MissingSetEpoch(Rule):
    """
    ## What it does
    Reports an epoch loop that iterates a loader with a `DistributedSampler`
    (with shuffling on) and never calls `set_epoch` on it. The report points at
    the epoch loop (`for` or `while`).

    ## Why is this bad?
    `DistributedSampler` seeds its shuffle with `seed + epoch`. Without
    `sampler.set_epoch(epoch)` the epoch stays 0, so every epoch replays the
    same permutation on every rank: the model sees the data in one fixed order,
    which hurts convergence silently. Loaders passed through
    `accelerator.prepare` (accelerate calls `set_epoch` itself), Lightning and
    Fabric loaders, `shuffle=False` samplers, evaluation loops and single
    passes are not reported; nor is a `set_epoch` reached through
    `loader.sampler`, `loader.batch_sampler.sampler` or a helper function of
    the same file.

    ## Example
    ```python
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    for epoch in range(epochs):
        for batch in loader:
            loss = model(batch).mean()
            loss.backward()
    ```

    ## Use instead
    ```python
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            loss = model(batch).mean()
            loss.backward()
    ```

    ## Fix safety
    Safe. The fix inserts `sampler.set_epoch(epoch)` as the first statement of
    the epoch loop when the sampler has a name there. When it has none (it was
    built inline in `DataLoader(...)`, or in a helper), the fix calls
    `lintdist.runtime.set_epoch(loader, epoch)`, which finds the sampler, and
    adds that import. A `while` loop is fixed when it increments an epoch
    counter (`epoch += 1`) in its body. There is no fix when the loop variable
    is `_` or a tuple, or when the sampler is rebuilt inside the loop.

    ## References
    - `torch.utils.data.distributed.DistributedSampler` docstring: "calling the
      `set_epoch` method at the beginning of each epoch before creating the
      DataLoader iterator is necessary to make shuffling work properly"
    - accelerate `DataLoaderShard.__iter__` (calls `set_epoch` for prepared loaders)
    """

    code = "LD201"
    name = "missing-set-epoch"
    severity = Severity.ERROR
    fix_kind = "safe"
    triggers = ("DistributedSampler",)

    VALID = (
        Valid(
            """\
from torch.utils.data import DataLoader, DistributedSampler

sampler = DistributedSampler(dataset)
loader = DataLoader(dataset, sampler=sampler)
for epoch in range(10):
    sampler.set_epoch(epoch)
    for batch in loader:
        model(batch).sum().backward()
"""
        ),
        Valid(
            """\
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from accelerate import Accelerator

accelerator = Accelerator()
loader = DataLoader(dataset, sampler=DistributedSampler(dataset))
model, loader = accelerator.prepare(model, loader)
for epoch in range(10):
    for batch in loader:
        accelerator.backward(model(batch).sum())
"""
        ),
        Valid(
            """\
import torch
from torch.utils.data import DataLoader, DistributedSampler

loader = DataLoader(dataset, sampler=DistributedSampler(dataset, shuffle=False))
for epoch in range(10):
    for batch in loader:
        model(batch).sum().backward()
"""
        ),
        Valid(
            """\
import torch
from torch.utils.data import DataLoader, DistributedSampler

val_loader = DataLoader(dataset, sampler=DistributedSampler(dataset))
for epoch in range(10):
    with torch.no_grad():
        for batch in val_loader:
            metric.update(model(batch))
"""
        ),
        Valid(
            """\
from torch.utils.data import DataLoader, DistributedSampler

loader = DataLoader(dataset, sampler=DistributedSampler(dataset))
for epoch in range(10):
    loader.batch_sampler.sampler.set_epoch(epoch)
    for batch in loader:
        model(batch).sum().backward()
"""
        ),
        Valid(
            """\
from torch.utils.data import DataLoader, DistributedSampler

def train_one_epoch(loader, epoch):
    loader.sampler.set_epoch(epoch)
    for batch in loader:
        model(batch).sum().backward()

loader = DataLoader(dataset, sampler=DistributedSampler(dataset))
for epoch in range(10):
    train_one_epoch(loader, epoch)
"""
        ),
        Valid(
            """\
from torch.utils.data import DataLoader, DistributedSampler

loader = DataLoader(dataset, sampler=DistributedSampler(dataset))
for batch in loader:
    model(batch).sum().backward()
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
from torch.utils.data import DataLoader, DistributedSampler

sampler = DistributedSampler(dataset)
loader = DataLoader(dataset, batch_size=8, sampler=sampler)
for epoch in range(10):
    # one pass over the data
    for batch in loader:
        model(batch).sum().backward()
""",
            lines=(5,),
            fixed="""\
from torch.utils.data import DataLoader, DistributedSampler

sampler = DistributedSampler(dataset)
loader = DataLoader(dataset, batch_size=8, sampler=sampler)
for epoch in range(10):
    sampler.set_epoch(epoch)
    # one pass over the data
    for batch in loader:
        model(batch).sum().backward()
""",
        ),
        Invalid(
            """\
import torch.utils.data as tud

loader = tud.DataLoader(dataset, sampler=tud.distributed.DistributedSampler(dataset))

def train(model, data):
    for batch in data:
        model(batch).sum().backward()

for ep in range(3):
    train(model, loader)
""",
            lines=(9,),
            fixed="""\
import torch.utils.data as tud
from lintdist.runtime import set_epoch

loader = tud.DataLoader(dataset, sampler=tud.distributed.DistributedSampler(dataset))

def train(model, data):
    for batch in data:
        model(batch).sum().backward()

for ep in range(3):
    set_epoch(loader, ep)
    train(model, loader)
""",
        ),
        Invalid(
            """\
from torch.utils.data import DataLoader, DistributedSampler as DS

sampler = DS(dataset)
loader = DataLoader(dataset, sampler=sampler)
epoch = 0
while epoch < 5:
    for batch in loader:
        model(batch).sum().backward()
    epoch += 1
""",
            lines=(6,),
            fixed="""\
from torch.utils.data import DataLoader, DistributedSampler as DS

sampler = DS(dataset)
loader = DataLoader(dataset, sampler=sampler)
epoch = 0
while epoch < 5:
    sampler.set_epoch(epoch)
    for batch in loader:
        model(batch).sum().backward()
    epoch += 1
""",
        ),
        Invalid(
            """\
from torch.utils.data import DataLoader, DistributedSampler

loader = DataLoader(dataset, sampler=DistributedSampler(dataset))
for _ in range(3):
    for batch in loader:
        model(batch).sum().backward()
""",
            lines=(4,),
        ),
    )

    def finish(self) -> None:
        uses_by_loop: dict[int, tuple[Loop, list[tuple[SamplerUse, cst.BaseExpression]]]] = {}
        for loop in self.facts.loops:
            if not isinstance(loop, cst.For):
                continue
            loader = _iterated(loop.iter)
            if loader is None or self.facts.under_no_grad(loop) or not self._trains(loop):
                continue
            use = self._sampler_use(loader, loop)
            if use is None:
                continue
            for epoch_loop, loader_there in self._epoch_loops(loop, loader):
                uses_by_loop.setdefault(id(epoch_loop), (epoch_loop, []))[1].append((use, loader_there))
        for epoch_loop, uses in uses_by_loop.values():
            if _single_pass(epoch_loop) or self._sets_epoch(epoch_loop):
                continue
            self._report(epoch_loop, uses)

    # -- detection ----------------------------------------------------------------------

    def _trains(self, loop: cst.For) -> bool:
        return any(self.facts.method_name(call) in BACKWARD_METHODS for call in self.facts.reachable_calls(loop.body))

    def _sampler_use(self, loader: cst.BaseExpression, at: cst.CSTNode) -> SamplerUse | None:
        facts = self.facts
        origins = facts.origins(loader, at)
        if any(facts.is_prepare_call(o.node) for o in origins):
            return None  # accelerate and Fabric loaders set the epoch themselves
        for origin in origins:
            node = origin.node
            if not isinstance(node, cst.Call) or origin.index is not None:
                continue
            if _wrapped(node) is not None:  # `progress = tqdm(loader)` ... `for batch in progress`
                return self._sampler_use(_wrapped(node), node)
            is_dataloader = facts.is_instance_of(node, DATALOADER_CLASSES)
            sampler_arg = argument_of(node, "sampler", 3 if is_dataloader else None)
            candidates = [sampler_arg] if sampler_arg is not None else []
            batch_sampler = argument_of(node, "batch_sampler", 4 if is_dataloader else None)
            if batch_sampler is not None:
                for inner in facts.origins(batch_sampler, node):
                    if isinstance(inner.node, cst.Call):
                        wrapped = argument_of(inner.node, "sampler", 0)
                        if wrapped is not None:
                            candidates.append(wrapped)
            for candidate in candidates:
                for sampler in facts.origins(candidate, node):
                    call = sampler.node
                    if isinstance(call, cst.Call) and facts.is_instance_of(call, SAMPLER_CLASSES, "DistributedSampler"):
                        shuffle = argument_of(call, "shuffle", 3)
                        if isinstance(shuffle, cst.Name) and shuffle.value == "False":
                            continue
                        certain = shuffle is None or (isinstance(shuffle, cst.Name) and shuffle.value == "True")
                        return SamplerUse(call, candidate, node, certain)
        return None

    def _epoch_loops(
        self, node: cst.CSTNode, loader: cst.BaseExpression, depth: int = 0
    ) -> list[tuple[Loop, cst.BaseExpression]]:
        """The loops that run ``node`` once per iteration, with the loader's expression there.

        When ``node`` sits in a function with no loop around it, the loops around
        the function's call sites count, the loader followed through its parameter.
        """
        facts = self.facts
        outer = facts.enclosing_loop(node)
        if outer is not None:
            return [(outer, loader)]
        function = facts.enclosing_function(node)
        if function is None or depth >= MAX_CALLER_DEPTH:
            return []
        found = []
        for call in facts.call_sites(function):
            passed = self._passed(loader, node, function, call)
            if passed is not None:
                found.extend(self._epoch_loops(call, passed, depth + 1))
        return found

    def _passed(
        self, loader: cst.BaseExpression, at: cst.CSTNode, function: cst.FunctionDef, call: cst.Call
    ) -> cst.BaseExpression | None:
        """The caller's expression for ``loader``: the argument, when ``loader`` is a parameter."""
        if not isinstance(loader, cst.Name):
            return loader
        parameter = self.facts.parameter(loader.value, at)
        if parameter is None:
            return loader
        _, index, _ = parameter
        offset = 1 if self.facts.enclosing_class(function) is not None and index >= 0 else 0
        return argument_of(call, loader.value, index - offset if index >= 0 else None)

    def _sets_epoch(self, epoch_loop: Loop) -> bool:
        return any(self.facts.method_name(call) == "set_epoch" for call in self.facts.reachable_calls(epoch_loop.body))

    # -- the report and its fix -------------------------------------------------------------

    def _report(self, epoch_loop: Loop, uses: list[tuple[SamplerUse, cst.BaseExpression]]) -> None:
        use, loader_there = uses[0]
        epoch = _epoch_variable(epoch_loop)
        receiver, helper = self._receiver(epoch_loop, use, loader_there)
        call_text = (f"set_epoch({receiver}, {epoch or 'epoch'})" if helper else f"{receiver}.set_epoch({epoch or 'epoch'})") if receiver else None
        subject = f"`{get_full_name_for_node(use.sampler_arg)}`" if isinstance(use.sampler_arg, (cst.Name, cst.Attribute)) else (
            "the `DistributedSampler` of this loader"
        )
        advice = f"call `{call_text}` at the start of each epoch" if call_text else "call `sampler.set_epoch(epoch)` at the start of each epoch"
        message = (
            f"{subject} is never told the epoch, so every epoch replays the same shuffle order on every rank; {advice}"
        )
        fix = None
        if epoch and receiver and isinstance(epoch_loop.body, cst.IndentedBlock):
            statement = cst.parse_statement(f"{call_text}\n")
            body = epoch_loop.body
            fix = Fix(
                Applicability.SAFE,
                f"Insert `{call_text}` at the start of the epoch loop",
                replacements=((body, body.with_changes(body=(statement, *body.body))),),
                imports=(("lintdist.runtime", "set_epoch"),) if helper else (),
            )
        self.report(epoch_loop, message, fix=fix, severity=None if use.certain else Severity.WARNING)

    def _receiver(self, epoch_loop: Loop, use: SamplerUse, loader_there: cst.BaseExpression) -> tuple[str | None, bool]:
        """What to call ``set_epoch`` on at the epoch loop: the sampler's name, or the loader through the helper."""
        facts = self.facts
        for expr, target, helper in ((use.sampler_arg, use.sampler, False), (loader_there, use.loader, True)):
            if not isinstance(expr, (cst.Name, cst.Attribute)):
                continue
            key = get_full_name_for_node(expr)
            if key is None or any(facts.is_within(b.statement, epoch_loop) for b in facts.bindings(key, epoch_loop)):
                continue
            if any(o.node is target for o in facts.origins(expr, epoch_loop)):
                if helper and not self._helper_name_free():
                    return None, False
                return key, helper
        return None, False

    def _helper_name_free(self) -> bool:
        """``set_epoch`` is not already a module-level name for something else."""
        scope = self.context.wrapper.resolve(ScopeProvider).get(self.context.module)
        if not isinstance(scope, GlobalScope) or "set_epoch" not in scope:
            return True
        return all(
            isinstance(a.node, cst.ImportFrom) and get_full_name_for_node(a.node.module) == "lintdist.runtime"
            for a in scope["set_epoch"]
        )


def _wrapped(call: cst.Call) -> cst.BaseExpression | None:
    """The iterable inside ``enumerate(x)``, ``tqdm(x, ...)``, ``iter(x)``; None for other calls."""
    name = get_full_name_for_node(call.func) or ""
    if name.rsplit(".", 1)[-1] not in ITERATION_WRAPPERS:
        return None
    return argument_of(call, "iterable", 0)


def _iterated(expr: cst.BaseExpression | None) -> cst.BaseExpression | None:
    """``loader`` from ``loader``, ``enumerate(loader)``, ``tqdm(loader, ...)``..."""
    while isinstance(expr, cst.Call):
        expr = _wrapped(expr)
    return expr if isinstance(expr, (cst.Name, cst.Attribute)) else None


def _single_pass(loop: Loop) -> bool:
    if not isinstance(loop, cst.For):
        return False
    iterator = loop.iter
    if isinstance(iterator, (cst.List, cst.Tuple)):
        return len(iterator.elements) <= 1
    return (
        isinstance(iterator, cst.Call)
        and get_full_name_for_node(iterator.func) == "range"
        and len(iterator.args) == 1
        and isinstance(iterator.args[0].value, cst.Integer)
        and iterator.args[0].value.evaluated_value <= 1
    )


def _epoch_variable(loop: Loop) -> str | None:
    """The loop's epoch counter: a plain ``for`` target, or a ``while`` body's ``name += 1``."""
    if isinstance(loop, cst.For):
        target = loop.target
        return target.value if isinstance(target, cst.Name) and target.value != "_" else None
    if isinstance(loop.body, cst.IndentedBlock):
        for statement in loop.body.body:
            if isinstance(statement, cst.SimpleStatementLine):
                for small in statement.body:
                    if (
                        isinstance(small, cst.AugAssign)
                        and isinstance(small.operator, cst.AddAssign)
                        and isinstance(small.target, cst.Name)
                        and isinstance(small.value, cst.Integer)
                        and small.value.value == "1"
                    ):
                        return small.target.value
    return None
