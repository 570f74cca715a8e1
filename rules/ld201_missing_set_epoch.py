"""LD201 missing-set-epoch: a DistributedSampler iterated every epoch but never told which one."""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.evaluation import evaluates
from lintdist.facts import Loop, SamplerUse, epoch_counter, single_pass
from lintdist.invariance import fixed_name
from lintdist.loaders import loader_passes
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Pattern, Rule, Valid
from lintdist.samplers import (
    epoch_told_around,
    epoch_told_out_of_sight,
    reseeded_each_pass,
    unshuffled_by_name,
    wrapper_tells_epoch,
)


class MissingSetEpoch(Rule):
    """
    ## What it does
    Reports an epoch loop that iterates a loader with a `DistributedSampler`
    (with shuffling on) and never calls `set_epoch` on it. The loader may be
    walked by `for batch in loader` (through `enumerate`, `tqdm`), through a
    call the loop wraps around it (a backend's `distribute(loader)`), or by
    `next(it)` (or `it.next()`) on `it = iter(loader)`, also when the step loop
    makes a new iterator each time one runs out; the pass need not train (a
    mining or statistics pass replays the same order too). The sampler's class
    may be chosen at run time (`pick = RandomSampler if local_rank == -1 else
    DistributedSampler`, then `sampler=pick(dataset)`): it counts when one
    choice is a `DistributedSampler`. One report per epoch loop names every
    sampler it walks. The report points at the epoch loop (`for` or `while`).

    ## Why is this bad?
    `DistributedSampler` seeds its shuffle with `seed + epoch`. Without
    `sampler.set_epoch(epoch)` the epoch stays 0, so every epoch replays the
    same permutation on every rank: the model sees the data in one fixed order,
    which hurts convergence silently. Loaders passed through
    `accelerator.prepare` (accelerate calls `set_epoch` itself), Lightning and
    Fabric loaders, `shuffle=False` samplers, evaluation passes (under
    `no_grad`/`inference_mode`, after `model.eval()` with no backward, or in
    a function named for evaluation: `evaluate`, `validate`, `test`,
    `predict`, `infer`) and single passes are not reported; nor is a `set_epoch` reached through
    `loader.sampler`, `loader.batch_sampler.sampler`, `getattr(...)`, a helper
    function of the same file, or a loop around the reported one (an inner
    loop that repeats passes within one epoch). Nor are a sampler rebuilt each
    epoch with a seed that follows the epoch, an iterator made once before the
    epoch loop and never again (the loader is walked once in all), a sampler
    of another library whose name says it keeps the order
    (`OrderedDistributedSampler`), a file where a callback or hook lintdist cannot follow calls `set_epoch`,
    and a loop over a wrapper of the project's own (a class or function, in
    this module or another) that calls `set_epoch` or assigns
    `sampler.epoch` itself, as endless loaders do at each restart.

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
    the epoch loop when the sampler has a name there, one statement per
    sampler the loop walks. When it has none (it was built inline in
    `DataLoader(...)`, or in a helper), or its name is bound only on some
    paths (`if local_rank != -1: sampler = DistributedSampler(ds)`: a one-process
    run would raise NameError), the fix calls
    `lintdist.runtime.set_epoch(loader, epoch)`, which finds the sampler, and
    adds that import. A sampler name that may also hold `None` or a sampler
    without `set_epoch` (`RandomSampler(ds) if local_rank == -1 else
    DistributedSampler(ds)`, or a class chosen that way) gets
    `set_epoch(sampler, epoch)` from the same module, which skips what has no
    `set_epoch`: a plain method call would raise AttributeError in the
    single-process run. A `while` loop is fixed when it increments an epoch
    counter (`epoch += 1`) in its body. There is no fix when the loop variable
    is `_` or a tuple, when the sampler is rebuilt inside the loop, when a
    sampler has no name to reach it by, and when an iterator is made again
    each time it runs out: every restart needs a new epoch number (a count of
    that loader's passes, set just before `iter(loader)`), which one call at the
    top of the epoch loop cannot give when a loader runs out twice in an
    epoch.

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
    # the sampler, or a distributed script's epoch loop over a loader made in another module of the project
    triggers = (
        "DistributedSampler",
        Pattern(("torch.distributed",), re.compile(r"for\s+\w*epoch\w*\s+in\b")),
    )

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
        Valid(
            """\
from torch.utils.data import DataLoader, DistributedSampler

loader = DataLoader(dataset, sampler=DistributedSampler(dataset))
stream = iter(loader)
for epoch in range(3):
    for step in range(100):
        model(next(stream)).sum().backward()
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
        # epoch loop -> the training loaders with a DistributedSampler it walks, one per sampler
        epoch_loops: dict[int, tuple[Loop, dict[int, Walk]]] = {}
        for loop, loader in loader_passes(facts):
            use = facts.distributed_sampler(loader, loop)
            if use is None or unshuffled_by_name(facts, use.sampler) or evaluates(facts, loop):
                continue
            if wrapper_tells_epoch(facts, loader, loop):  # an endless loader that restarts its sampler itself
                continue
            starts = facts.iterator_starts(loader)
            # an iterator made again inside the loop that pulls from it, when it runs out
            restarted = any(facts.is_within(start, loop) for start in starts)
            for epoch_loop, loader_there in facts.epoch_loops(loop, loader):
                made_before = bool(starts) and not any(facts.is_within(start, epoch_loop) for start in starts)
                if made_before and not restarted and facts.is_within(loop, epoch_loop):
                    continue  # one iterator, made before the epoch loop: the loader is walked once in all
                walks = epoch_loops.setdefault(id(epoch_loop), (epoch_loop, {}))[1]
                known = walks.setdefault(id(use.sampler), Walk(use, loader_there, restarted))
                if restarted and not known.restarted:
                    walks[id(use.sampler)] = Walk(use, known.loader, True)
        for epoch_loop, walks in epoch_loops.values():
            if (
                single_pass(epoch_loop)
                or epoch_told_around(facts, epoch_loop)
                or epoch_told_out_of_sight(facts, epoch_loop)
            ):
                continue
            counter = epoch_counter(epoch_loop)
            kept = [w for w in walks.values() if not reseeded_each_pass(facts, w.use.sampler, epoch_loop, counter)]
            if kept:
                self._report(epoch_loop, kept)

    # -- the report and its fix -------------------------------------------------------------

    def _report(self, epoch_loop: Loop, walks: list[Walk]) -> None:
        epoch = epoch_counter(epoch_loop)
        restarted = any(walk.restarted for walk in walks)
        counter = "n" if restarted else epoch or "epoch"
        receivers = [self._set_epoch_call(epoch_loop, walk.use, walk.loader, counter) for walk in walks]
        helpers = any(helper for _, helper in receivers)
        calls = [call for call, _ in receivers]
        subjects = [self._subject(walk) for walk in walks]
        spelled = [f"`{call or f'sampler.set_epoch({counter})'}`" for call in calls]
        prefix = "the `DistributedSampler` of "
        if len(subjects) > 1 and all(subject.startswith(f"{prefix}`") for subject in subjects):
            subjects = [f"the `DistributedSampler`s of {subjects[0][len(prefix) :]}"] + [
                subject[len(prefix) :] for subject in subjects[1:]
            ]
        verb = "is" if len(walks) == 1 else "are"
        if restarted:
            message = (
                f"{_and(subjects)} {verb} never told the epoch, and the iterator over "
                f"{'it' if len(walks) == 1 else 'each'} is made again with `iter(...)` when it runs out, so every "
                f"pass replays the same shuffle order on every rank; before each `iter(...)`, call {_and(spelled)} "
                "with `n` counting that loader's passes"
                + (" (`set_epoch` from `lintdist.runtime`, which skips a sampler without one)" if helpers else "")
            )
        else:
            message = (
                f"{_and(subjects)} {verb} never told the epoch, so every epoch replays the same shuffle order on "
                f"every rank; call {_and(spelled)} at the start of each epoch"
            )
        fix = None
        # a restarted iterator needs a new epoch at each restart, which the top of the epoch loop cannot give
        if epoch and not restarted and None not in calls and isinstance(epoch_loop.body, cst.IndentedBlock):
            body = epoch_loop.body
            statements = tuple(cst.parse_statement(f"{call}\n") for call in calls)
            fix = Fix(
                Applicability.SAFE,
                f"Insert {_and(spelled)} at the start of the epoch loop",
                replacements=((body, body.with_changes(body=(*statements, *body.body))),),
                imports=(("lintdist.runtime", "set_epoch"),) if helpers else (),
            )
        known = all(walk.use.shuffle for walk in walks)
        self.report(epoch_loop, message, fix=fix, severity=None if known else Severity.WARNING)

    def _subject(self, walk: Walk) -> str:
        use = walk.use
        made_elsewhere = self.facts.stand_in_note(use.loader)
        if made_elsewhere:
            return f"the `DistributedSampler` of the loader {made_elsewhere}"
        if isinstance(use.sampler_arg, (cst.Name, cst.Attribute)):
            return f"`{get_full_name_for_node(use.sampler_arg)}`"
        if isinstance(walk.loader, (cst.Name, cst.Attribute)):
            return f"the `DistributedSampler` of `{get_full_name_for_node(walk.loader)}`"
        return "the `DistributedSampler` of this loader"

    def _set_epoch_call(
        self, epoch_loop: Loop, use: SamplerUse, loader_there: cst.BaseExpression, counter: str
    ) -> tuple[str | None, bool]:
        """The ``set_epoch`` call for the epoch loop, and whether it is the helper: on the sampler's name, or on the
        loader through the helper.
        A sampler name the loop may reach unbound (made only under ``if local_rank != -1:``) is no receiver: the
        loop reads the loader, so the loader's name is bound wherever the loop runs."""
        facts = self.facts
        for expr, target, helper in ((use.sampler_arg, use.sampler, False), (loader_there, use.loader, True)):
            key = fixed_name(facts, expr, epoch_loop)
            if key is None:
                continue
            # the loop reads the loader's name itself, but not the sampler's
            if not helper and isinstance(expr, cst.Name) and not facts.surely_bound(key, epoch_loop):
                continue
            origins = facts.origins(expr, epoch_loop)
            if any(o.node is target for o in origins):
                # a sampler that may be None elsewhere (`sampler = None` in the single-process branch), or whose
                # class is chosen at run time, goes through the helper, which skips what has no `set_epoch`
                helper = helper or use.chosen or any(o.node is not target for o in origins)
                if helper and not self.context.runtime_name_free("set_epoch"):
                    return None, False
                return (f"set_epoch({key}, {counter})" if helper else f"{key}.set_epoch({counter})"), helper
        return None, False


@dataclass(frozen=True)
class Walk:
    """A loader with a shuffling DistributedSampler that an epoch loop walks."""

    use: SamplerUse
    loader: cst.BaseExpression  # the loader's expression at the epoch loop
    restarted: bool  # pulled from an iterator that is made again when it runs out


def _and(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"
