"""LD204 distributed-sampler-into-prepare: a loader that already shards by rank, handed to accelerate to shard again."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.edits import has_comment
from lintdist.facts import DATALOADER_CLASSES, SAMPLER_CLASSES, argument_of
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import IMPORTED_LOADER, Invalid, Pattern, Rule, Valid

IMPORTS_ACCELERATE = re.compile(r"^\s*(?:from|import)\s+accelerate\b", re.MULTILINE)
PREPARE_FUNCTIONS = frozenset({"accelerate.data_loader.prepare_data_loader"})
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
        self._names = self.facts.index.nodes(cst.Name)
        reported: set[int] = set()
        for call in self.facts.calls:
            for loader in self._prepared(call):
                for found in self._sharded(loader, call):
                    if id(found.sampler) not in reported:
                        reported.add(id(found.sampler))
                        self._report(found)

    # -- what reaches prepare ------------------------------------------------------------------

    def _prepared(self, call: cst.Call) -> list[cst.BaseExpression]:
        """The loader arguments of an accelerate prepare call; empty for any other call."""
        facts = self.facts
        if facts.callee_is(call, PREPARE_FUNCTIONS):
            loader = argument_of(call, "dataloader", 0)
            return [loader] if loader is not None else []
        if not isinstance(call.func, cst.Attribute) or call.func.attr.value not in ("prepare", "prepare_data_loader"):
            return []
        if not self._is_accelerator(call.func.value, call):
            return []
        method = call.func.attr.value
        if method == "prepare":
            return [arg.value for arg in call.args if arg.keyword is None and not arg.star]
        if method == "prepare_data_loader":
            loader = argument_of(call, "data_loader", 0)
            return [loader] if loader is not None else []
        return []

    def _is_accelerator(self, receiver: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """An ``Accelerator``, or (when its origin is out of sight) a name like ``accelerator`` in an accelerate script."""
        if self.facts.is_accelerator(receiver, at):
            return True
        name = (get_full_name_for_node(receiver) or "").rsplit(".", 1)[-1]
        return name.endswith("accelerator") and IMPORTS_ACCELERATE.search(self.context.text) is not None

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
        facts = self.facts
        values = [o for o in facts.origins(argument, loader) if not self._unreachable(o.node, loader)]
        hits = []
        for value in values:
            node = value.node
            if not isinstance(node, cst.Call):
                continue
            if self._rank_aware(node):
                hits.append(node)
            elif batched:  # BatchSampler(DistributedSampler(...), ...) shards inside the batch sampler
                wrapped = argument_of(node, "sampler", 0)
                if wrapped is not None:
                    hits.extend(o.node for o in facts.origins(wrapped, node) if self._rank_aware(o.node))
        certain = len(hits) == len(values)
        inline = next(
            (a for a in loader.args if a.value is argument and a.keyword is not None and a.keyword.value == "sampler"),
            None,
        )
        return [
            Sharded(hit, loader, prepare, certain, inline if inline is not None and hit is argument else None, batched)
            for hit in hits
        ]

    def _unreachable(self, value: cst.CSTNode, user: cst.CSTNode) -> bool:
        """``value``, built in the function that runs ``user``, cannot be what ``user`` receives: it sits in the
        other branch of an ``if`` (a raw-DDP branch beside an accelerate one), or after ``user`` outside any loop."""
        facts = self.facts
        if facts.enclosing_function(value) is not facts.enclosing_function(user) or facts.is_within(value, user):
            return False
        user_path: dict[int, cst.CSTNode] = {}  # ancestor of user -> its child on the way to user
        child: cst.CSTNode = user
        for ancestor in facts.ancestors(user):
            user_path[id(ancestor)] = child
            child = ancestor
        child = value
        for common in facts.ancestors(value):
            if id(common) in user_path:
                break
            child = common
        else:
            return False
        if isinstance(common, cst.If) and {id(child), id(user_path[id(common)])} == {
            id(common.body),
            id(common.orelse),
        }:
            return True
        value_at, user_at = self.context.span(value), self.context.span(user)
        if (value_at.line, value_at.column) <= (user_at.line, user_at.column):
            return False
        for node in (common, *facts.ancestors(common)):  # a loop around both runs the later line first next time
            if isinstance(node, (cst.FunctionDef, cst.Lambda)):
                break
            if isinstance(node, (cst.For, cst.While)):
                return False
        return True

    def _rank_aware(self, node: cst.CSTNode) -> bool:
        """``DistributedSampler`` or a subclass, a class named ``Distributed...Sampler``, or a sampler given
        ``num_replicas=`` and ``rank=``; not one told that there is a single replica."""
        if not isinstance(node, cst.Call):
            return False
        replicas = argument_of(node, "num_replicas", None)
        if isinstance(replicas, cst.Integer) and replicas.evaluated_value == 1:
            return False
        if self.facts.is_instance_of(node, SAMPLER_CLASSES, "DistributedSampler"):
            return True
        name = (get_full_name_for_node(node.func) or "").rsplit(".", 1)[-1]
        if name.startswith("Distributed") and name.endswith("Sampler"):
            return True
        return replicas is not None and argument_of(node, "rank", None) is not None

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
        if dataset is None or own is None or code(dataset) != code(own) or not self._only_prepared(loader, found):
            return None
        shuffle_value = cst.parse_expression(shuffle)
        new_arg = found.inline.with_changes(keyword=cst.Name("shuffle"), value=shuffle_value)
        return Fix(
            Applicability.SAFE,
            f"Replace the sampler with `shuffle={shuffle}` and let accelerate shard the loader",
            replacements=((found.inline, new_arg),),
        )

    def _only_prepared(self, loader: cst.Call, found: Sharded) -> bool:
        """The loader built here reaches nothing but ``prepare``: it is a prepare argument itself, or it is
        bound to a name that is read only by that prepare call, and later only after prepare rebinds it."""
        facts = self.facts
        prepare = found.prepare
        if any(arg.value is loader for arg in prepare.args):
            return True
        statement = facts.parent(loader)
        if not (
            isinstance(statement, cst.Assign)
            and len(statement.targets) == 1
            and isinstance(statement.targets[0].target, cst.Name)
        ):
            return False
        name = statement.targets[0].target.value
        function = facts.enclosing_function(statement)
        if facts.enclosing_function(prepare) is not function:
            return False
        prepare_statement = facts.parent(prepare)
        rebinds = isinstance(prepare_statement, cst.Assign) and any(
            name in _target_names(target.target) for target in prepare_statement.targets
        )
        prepare_line = self.context.span(prepare).line
        for use in self._names:
            if use.value != name or use is statement.targets[0].target or not facts.is_variable(use):
                continue
            if facts.is_within(use, prepare_statement if rebinds else prepare):
                continue
            user = facts.enclosing_function(use)
            if user is function:
                # the same variable: fine only once prepare has replaced it with the prepared loader
                safe = rebinds and self.context.span(use).line > prepare_line
            elif function is None or (user is not None and facts.is_within(user, function)):
                # a function reading the module-level loader, or a closure reading the local one
                safe = _local_to(use, user, facts)
            else:
                safe = True  # another function's own variable of the same name
            if not safe:
                return False
        return True


def _only_droppable_arguments(sampler: cst.Call) -> bool:
    positional = 0
    for arg in sampler.args:
        if arg.star:
            return False
        if arg.keyword is None:
            positional += 1
            if positional > len(DROPPABLE):
                return False
        elif arg.keyword.value not in DROPPABLE:
            return False
    return True


def _target_names(target: cst.BaseExpression) -> set[str]:
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, (cst.Tuple, cst.List)):
        return {n for element in target.elements for n in _target_names(element.value)}
    return set()


def _local_to(use: cst.Name, function: cst.FunctionDef | None, facts) -> bool:
    """``use`` reads a parameter or a local variable of its own function."""
    if function is None:
        return False
    if facts.parameter(use.value, use) is not None:
        return True
    return any(binding.function is function for binding in facts.bindings(use.value, use))
