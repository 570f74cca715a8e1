"""LD204 distributed-sampler-into-prepare: a loader that already shards by rank, handed to accelerate to shard again."""

from __future__ import annotations

from dataclasses import dataclass, replace

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.accelerators import prepared_loaders
from lintdist.edits import has_comment
from lintdist.facts import DATALOADER_CLASSES, SAMPLER_CLASSES, argument_of
from lintdist.model import Applicability, Fix, Severity
from lintdist.receivers import never_received, only_consumer
from lintdist.rule import IMPORTED_LOADER, Invalid, Pattern, Rule, Valid
from lintdist.samplers import rank_aware_among

# DistributedSampler(dataset, num_replicas, rank, shuffle, seed, drop_last): the arguments the fix may drop.
# accelerate picks the replicas and the rank itself; the seed only fixes the order, which accelerate reseeds.
DROPPABLE = {"dataset": 0, "num_replicas": 1, "rank": 2, "shuffle": 3, "seed": 4}


@dataclass(frozen=True)
class Sharded:
    """A rank-aware sampler behind a loader that reaches ``prepare``."""

    sampler: cst.Call  # the sampler's constructor call: where the report points
    loader: cst.Call  # the DataLoader(...) call
    prepare: cst.Call
    certain: bool  # every value the loader's sampler argument can take shards by rank
    inline: cst.Arg | None  # the loader's `sampler=DistributedSampler(...)` argument, when written inline
    batched: bool  # the sampler sits inside the loader's batch sampler


class DistributedSamplerIntoPrepare(Rule):
    """
    ## What it does
    Reports a `DistributedSampler` (a subclass, another rank-aware sampler, or
    a batch sampler wrapping one) inside a `DataLoader` that is passed to
    `accelerator.prepare(...)`, `accelerator.prepare_data_loader(...)` or
    `accelerate.data_loader.prepare_data_loader(...)`. The report points at
    the sampler's construction and names the `prepare` line: the sampler is
    what has to change (one `prepare` call often takes several loaders), and
    its line is where a suppression comment belongs.

    ## Why is this bad?
    accelerate shards every loader it prepares: `prepare_data_loader` wraps the
    loader's batch sampler in a `BatchSamplerShard` that gives each process
    every W-th batch. A `DistributedSampler` has already kept only this rank's
    1/W of the samples, so each rank trains on 1/W² of the data and the ranks
    together see only 1/W of it each epoch, with no error or warning. No
    option avoids the second split: `split_batches` splits each batch
    instead, `dispatch_batches` lets the main process read its own 1/W shard
    and slice it among all ranks, `even_batches` and `use_seedable_sampler`
    change padding and `RandomSampler` seeding only, and accelerate 1.15 has
    no switch for loaders that are already sharded. (A single process keeps the
    loader as it is, and an `IterableDataset` cannot take a sampler at all.)

    Lightning's `Trainer` and Fabric's `setup_dataloaders` keep a
    `DistributedSampler` they find, so they are not reported; nor is a loader
    with a `DistributedSampler` that a raw `torch.distributed` script iterates
    without `prepare`, nor a sampler built with `num_replicas=1`. A loader
    built in the other branch of an `if` than the `prepare` call (a raw DDP
    branch beside an accelerate one) does not reach it; one that only may reach
    it (a helper that returns a plain loader or a sharded one) is a warning.

    ## Example
    ```python
    loader = DataLoader(dataset, batch_size=32, sampler=DistributedSampler(dataset, shuffle=True))
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    ```

    ## Use instead
    ```python
    loader = DataLoader(dataset, batch_size=32, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    ```

    ## Fix safety
    Safe, and offered only when the sampler is written inline as the
    loader's `sampler=` argument, is `torch`'s own `DistributedSampler`, is
    built on the loader's own dataset with no arguments other than `dataset`,
    `num_replicas`, `rank`, `shuffle` and `seed`, and the loader goes only to
    `prepare` (passed there directly, or through a name nothing else reads
    before `prepare` rebinds it). The fix replaces `sampler=...` with the
    sampler's `shuffle` value (`True` when it was left out, as
    `DistributedSampler` shuffles by default). accelerate then shuffles with a
    generator synchronized across ranks and gives each rank its own 1/W, new
    every epoch. `drop_last=` of a `DistributedSampler` trims the dataset to a
    multiple of W, which is not what the loader's `drop_last` does, so such a
    sampler gets no fix; neither does a sampler bound to a name (it may be
    used elsewhere, for example in `sampler.set_epoch(epoch)`) or built in a
    helper, nor one with comments inside its call (the fix would delete them).
    The `DistributedSampler` import is left in place.

    ## References
    - accelerate `accelerate/data_loader.py`, `prepare_data_loader` and
      `BatchSamplerShard`
    - accelerate issues #3520, #4062, #4075 and #4199; transformers issue #34365
    - `torch.utils.data.distributed.DistributedSampler`
    """

    code = "LD204"
    name = "distributed-sampler-into-prepare"
    severity = Severity.ERROR
    needs_several_processes = True
    fix_kind = "safe"
    # the sampler, or a loader made in another module of the project with one (`from data import build_loader`)
    triggers = ("Sampler", Pattern(("loader",), IMPORTED_LOADER))
    also_triggers = (("prepare",),)

    VALID = (
        Valid(
            """\
from accelerate import Accelerator
from torch.utils.data import DataLoader

accelerator = Accelerator()
loader = DataLoader(dataset, batch_size=32, shuffle=True)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
"""
        ),
        Valid(
            """\
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

dist.init_process_group("nccl")
sampler = DistributedSampler(dataset)
loader = DataLoader(dataset, batch_size=32, sampler=sampler)
for epoch in range(3):
    sampler.set_epoch(epoch)
    for batch in loader:
        model(batch).sum().backward()
"""
        ),
        Valid(
            """\
import lightning as L
from torch.utils.data import DataLoader, DistributedSampler

fabric = L.Fabric(devices=2, strategy="ddp")
loader = fabric.setup_dataloaders(DataLoader(dataset, sampler=DistributedSampler(dataset)))
"""
        ),
        Valid(
            """\
from accelerate import Accelerator
from torch.utils.data import DataLoader, DistributedSampler

accelerator = Accelerator()
loader = DataLoader(dataset, sampler=DistributedSampler(dataset, num_replicas=1, rank=0))
loader = accelerator.prepare(loader)
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
from accelerate import Accelerator
from torch.utils.data import DataLoader, DistributedSampler

accelerator = Accelerator()
train_loader = DataLoader(
    dataset,
    batch_size=32,
    sampler=DistributedSampler(dataset, shuffle=False),  # keep the file order
)
model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)
""",
            lines=(8,),
            fixed="""\
from accelerate import Accelerator
from torch.utils.data import DataLoader, DistributedSampler

accelerator = Accelerator()
train_loader = DataLoader(
    dataset,
    batch_size=32,
    shuffle=False,  # keep the file order
)
model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)
""",
        ),
        Invalid(
            """\
import accelerate
import torch.utils.data as tud

accelerator = accelerate.Accelerator()
loader = accelerator.prepare_data_loader(tud.DataLoader(ds, 16, sampler=tud.DistributedSampler(ds, seed=3)))
""",
            lines=(5,),
            fixed="""\
import accelerate
import torch.utils.data as tud

accelerator = accelerate.Accelerator()
loader = accelerator.prepare_data_loader(tud.DataLoader(ds, 16, shuffle=True))
""",
        ),
        Invalid(
            """\
from accelerate import Accelerator
from torch.utils.data import BatchSampler, DataLoader
from torch.utils.data.distributed import DistributedSampler as DS


def build_loader(dataset):
    sampler = DS(dataset, drop_last=True)
    return DataLoader(dataset, batch_sampler=BatchSampler(sampler, 16, drop_last=True))


accelerator = Accelerator()
loader = build_loader(dataset)
model, loader = accelerator.prepare(model, loader)
""",
            lines=(7,),
        ),
    )

    def __init__(self, context) -> None:
        super().__init__(context)
        self._names: list[cst.Name] = []  # every name of the file, to see who else reads a loader's name

    def finish(self) -> None:
        reported: set[int] = set()
        for call in self.facts.calls:
            for loader in prepared_loaders(self.facts, call, self.context.text):
                for found in self._sharded(loader, call):
                    if id(found.sampler) not in reported:
                        reported.add(id(found.sampler))
                        self._report(found)

    # -- rank-aware samplers behind a loader ---------------------------------------------------

    def _sharded(self, loader: cst.BaseExpression, prepare: cst.Call) -> list[Sharded]:
        facts = self.facts
        found = []
        origins = [o for o in facts.origins(loader, prepare) if not self._unreachable(o.node, prepare)]
        plain = False  # some loader that can reach prepare has no rank-aware sampler
        for origin in origins:
            call = origin.node
            if not isinstance(call, cst.Call) or origin.index is not None or facts.is_prepare_call(call):
                continue
            is_dataloader = facts.is_instance_of(call, DATALOADER_CLASSES)
            sampler = argument_of(call, "sampler", 3 if is_dataloader else None)
            batch_sampler = argument_of(call, "batch_sampler", 4 if is_dataloader else None)
            hits = [
                hit
                for argument, batched in ((sampler, False), (batch_sampler, True))
                if argument is not None
                for hit in self._samplers(argument, call, prepare, batched)
            ]
            plain = plain or not hits
            found.extend(hits)
        # `get_dataloaders(distributed=False)` may return the plain loader: possible, not certain
        return [replace(hit, certain=False) for hit in found] if plain else found

    def _samplers(self, argument: cst.BaseExpression, loader: cst.Call, prepare: cst.Call, batched: bool):
        """The rank-aware sampler calls a loader's ``sampler=``/``batch_sampler=`` argument can hold."""
        values = [o.node for o in self.facts.origins(argument, loader) if not self._unreachable(o.node, loader)]
        hits = rank_aware_among(self.facts, values, batched)
        certain = len(hits) == len(values)
        inline = next(
            (a for a in loader.args if a.value is argument and a.keyword is not None and a.keyword.value == "sampler"),
            None,
        )
        return [Sharded(hit, loader, prepare, certain, inline if hit is argument else None, batched) for hit in hits]

    def _unreachable(self, value: cst.CSTNode, user: cst.CSTNode) -> bool:
        span = self.context.span
        return never_received(self.facts, value, user, lambda node: (span(node).line, span(node).column))

    # -- the report and its fix ------------------------------------------------------------------

    def _report(self, found: Sharded) -> None:
        sampler_name = (get_full_name_for_node(found.sampler.func) or "DistributedSampler").rsplit(".", 1)[-1]
        prepare_name = get_full_name_for_node(found.prepare.func) or "prepare"
        line = self.context.span(found.prepare).line
        shuffle = self._shuffle_text(found.sampler)
        if found.batched:
            advice = (
                "build the batch sampler on a `RandomSampler` instead (a `SequentialSampler` when it should not "
                "shuffle), accelerate splits the batches across ranks itself"
            )
        else:
            advice = (
                f"drop the sampler and give the DataLoader `shuffle={shuffle or '...'}` instead, accelerate splits "
                "the data across ranks itself"
            )
        message = (
            f"this `{sampler_name}` already gives each rank its own part of the data, and `{prepare_name}` "
            f"(line {line}) shards the loader again, so each rank trains on 1/W² of the data and the ranks "
            f"together on 1/W; {advice}"
        )
        fix = self._fix(found, shuffle)
        self.report(found.sampler, message, fix=fix, severity=None if found.certain else Severity.WARNING)

    def _shuffle_text(self, sampler: cst.Call) -> str | None:
        """The sampler's ``shuffle`` as source text (``True`` when left out); None if it cannot be told."""
        if any(arg.star for arg in sampler.args):
            return None
        value = argument_of(sampler, "shuffle", DROPPABLE["shuffle"])
        return "True" if value is None else self.context.module.code_for_node(value)

    def _fix(self, found: Sharded, shuffle: str | None) -> Fix | None:
        facts = self.facts
        sampler, loader = found.sampler, found.loader
        if found.inline is None or shuffle is None or not facts.callee_is(sampler, SAMPLER_CLASSES):
            return None
        if not _only_droppable_arguments(sampler) or has_comment(self.context.module.code_for_node(sampler)):
            return None  # (the fix would delete comments written inside the sampler call)
        if argument_of(loader, "shuffle", 2) is not None or argument_of(loader, "batch_sampler", 4) is not None:
            return None
        code = self.context.module.code_for_node
        dataset, own = argument_of(sampler, "dataset", 0), argument_of(loader, "dataset", 0)
        if (
            dataset is None
            or own is None
            or code(dataset) != code(own)
            or not only_consumer(facts, loader, found.prepare, lambda node: self.context.span(node).line)
        ):
            return None
        shuffle_value = cst.parse_expression(shuffle)
        new_arg = found.inline.with_changes(keyword=cst.Name("shuffle"), value=shuffle_value)
        return Fix(
            Applicability.SAFE,
            f"Replace the sampler with `shuffle={shuffle}` and let accelerate shard the loader",
            replacements=((found.inline, new_arg),),
        )


def _only_droppable_arguments(sampler: cst.Call) -> bool:
    """The sampler is given nothing but what accelerate decides itself (no ``*args``/``**kwargs``)."""
    positional = [arg for arg in sampler.args if arg.keyword is None]
    return (
        not any(arg.star for arg in positional)
        and len(positional) <= len(DROPPABLE)
        and all(arg.keyword.value in DROPPABLE for arg in sampler.args if arg.keyword is not None)
    )
