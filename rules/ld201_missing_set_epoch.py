"""LD201 missing-set-epoch: a DistributedSampler iterated every epoch but never told which one."""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node
from libcst.metadata import GlobalScope, ScopeProvider

from lintdist.facts import Loop, SamplerUse
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Rule, Valid

SET_EPOCH = frozenset({"set_epoch"})


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
import torch.utils.data


class ShardedSampler(torch.utils.data.distributed.DistributedSampler):
    pass


sampler = ShardedSampler(dataset, shuffle=args.shuffle)
for epoch in range(3):
    for batch in torch.utils.data.DataLoader(dataset, 8, None, sampler):
        model(batch).sum().backward()
""",
            lines=(9,),
            fixed="""\
import torch.utils.data


class ShardedSampler(torch.utils.data.distributed.DistributedSampler):
    pass


sampler = ShardedSampler(dataset, shuffle=args.shuffle)
for epoch in range(3):
    sampler.set_epoch(epoch)
    for batch in torch.utils.data.DataLoader(dataset, 8, None, sampler):
        model(batch).sum().backward()
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
        facts = self.facts
        # epoch loop -> the first training loader with a DistributedSampler it runs, and that loader's expression there
        epoch_loops: dict[int, tuple[Loop, SamplerUse, cst.BaseExpression]] = {}
        for loop, loader in facts.data_loops():
            use = facts.distributed_sampler(loader, loop)
            if use is None or facts.under_no_grad(loop) or not facts.trains(loop.body):
                continue
            for epoch_loop, loader_there in facts.epoch_loops(loop, loader):
                epoch_loops.setdefault(id(epoch_loop), (epoch_loop, use, loader_there))
        for epoch_loop, use, loader_there in epoch_loops.values():
            if not _single_pass(epoch_loop) and not facts.reaches_method(epoch_loop.body, SET_EPOCH):
                self._report(epoch_loop, use, loader_there)

    # -- the report and its fix -------------------------------------------------------------

    def _report(self, epoch_loop: Loop, use: SamplerUse, loader_there: cst.BaseExpression) -> None:
        epoch = _epoch_variable(epoch_loop)
        receiver, helper = self._receiver(epoch_loop, use, loader_there)
        if receiver is None:
            call_text = "sampler.set_epoch(epoch)"
        elif helper:
            call_text = f"set_epoch({receiver}, {epoch or 'epoch'})"
        else:
            call_text = f"{receiver}.set_epoch({epoch or 'epoch'})"
        if isinstance(use.sampler_arg, (cst.Name, cst.Attribute)):
            subject = f"`{get_full_name_for_node(use.sampler_arg)}`"
        else:
            subject = "the `DistributedSampler` of this loader"
        message = (
            f"{subject} is never told the epoch, so every epoch replays the same shuffle order on every rank; "
            f"call `{call_text}` at the start of each epoch"
        )
        fix = None
        if epoch and receiver and isinstance(epoch_loop.body, cst.IndentedBlock):
            body = epoch_loop.body
            fix = Fix(
                Applicability.SAFE,
                f"Insert `{call_text}` at the start of the epoch loop",
                replacements=((body, body.with_changes(body=(cst.parse_statement(f"{call_text}\n"), *body.body))),),
                imports=(("lintdist.runtime", "set_epoch"),) if helper else (),
            )
        self.report(epoch_loop, message, fix=fix, severity=None if use.shuffle else Severity.WARNING)

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
