"""LD203 ddp-loader-without-distributed-sampler: every rank of a raw DDP/FSDP job iterates the whole dataset."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.callgraph import run_together
from lintdist.dataset_split import split_by_rank
from lintdist.edits import keyword_arg
from lintdist.facts import SAMPLER_CLASSES, Loop, argument_of, epoch_counter, single_pass
from lintdist.invariance import fixed_name
from lintdist.layout import inserted_after
from lintdist.loaders import framework_loader, loader_calls, plain_loader, without_sampler
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import IMPORTED_LOADER, Invalid, Pattern, Rule, Valid
from lintdist.samplers import may_tell_epoch_of, torch_sampler
from lintdist.spelling import class_spelling

SAMPLER_MODULES = frozenset({"torch.utils.data", "torch.utils.data.distributed"})
WRAPPER_NAMES = ("DistributedDataParallel", "FullyShardedDataParallel", "fully_shard")


@dataclass(frozen=True)
class Use:
    """A training loop that draws batches from a loader expression: ``for`` over it, or ``next()`` of its iterator."""

    loop: Loop
    expr: cst.BaseExpression
    stepped: bool  # through ``next(it)``


class DdpLoaderWithoutDistributedSampler(Rule):
    """
    ## What it does
    Reports a `DataLoader` that a raw DistributedDataParallel or FSDP script
    (one that wraps its model in `DistributedDataParallel`,
    `FullyShardedDataParallel` or `fully_shard` itself) trains on, when the
    loader has neither a `sampler` nor a `batch_sampler` and its dataset is
    map-style. The report points at the `DataLoader(...)` call. Also
    reported, in any such script: a sampler passed as `shuffle=sampler`, a
    slip for `sampler=sampler` (the report points at the keyword).

    ## Why is this bad?
    DDP and FSDP split nothing: each process builds its own loader, and a
    loader without a sampler walks the whole dataset, in the same order on
    every rank when it does not shuffle, and in independent orders when it
    does. The ranks then train on copies of the same data: an epoch is W
    times longer than it should be (or W times fewer epochs fit in the
    budget), the effective batch holds the same samples W times, and nothing
    warns. `DistributedSampler` gives each rank its own 1/W of the indices.
    A sampler given as `shuffle=` is true, so the loader shuffles the whole
    dataset itself and never uses the sampler: the same outcome, while the
    script looks sharded (it even calls `sampler.set_epoch`).

    Not reported, because the data is split some other way: a loader passed
    to `accelerator.prepare`, Fabric's `setup_dataloaders` or a Lightning
    `Trainer` (or returned from a Lightning `*_dataloader` hook); an
    `IterableDataset` (a subclass, a `datasets` dataset loaded with
    `streaming=True` or turned into one with `to_iterable_dataset`,
    WebDataset and other streaming libraries), which cannot take a sampler and
    shards itself; a dataset already cut by rank (`split_dataset_by_node`,
    `.shard(num_shards=world, index=rank)`, `dataset[rank::world]`, a
    `Subset` of rank-dependent indices, a dataset class given the rank or
    reading it); a loader used only in evaluation (no backward pass in the
    loop, or under `torch.no_grad()`), or only on rank 0; and a script whose
    wrapped model and loader loop no common code path connects.

    ## Example
    ```python
    dist.init_process_group("nccl")
    model = DDP(model.to(local_rank), device_ids=[local_rank])
    loader = DataLoader(dataset, batch_size=32, shuffle=True)
    for epoch in range(epochs):
        for x, y in loader:
            loss_fn(model(x), y).backward()
            optimizer.step()
    ```

    ## Use instead
    ```python
    dist.init_process_group("nccl")
    model = DDP(model.to(local_rank), device_ids=[local_rank])
    loader = DataLoader(dataset, batch_size=32, sampler=DistributedSampler(dataset, shuffle=True))
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            loss_fn(model(x), y).backward()
            optimizer.step()
    ```

    ## Fix safety
    Unsafe (`--unsafe-fixes`): each rank then sees 1/W of the data per epoch,
    so the number of steps per epoch, learning-rate schedules computed from
    `len(loader)`, and logged epoch metrics all change, and
    `DistributedSampler` pads the dataset with repeated samples up to a
    multiple of W (unless given `drop_last=True`). The fix replaces
    `shuffle=X` with `sampler=DistributedSampler(dataset, shuffle=X)` (a loader
    without `shuffle` gets `shuffle=False`, keeping the order it had), using
    the file's existing import of `DistributedSampler` or adding
    `from torch.utils.data import DistributedSampler`. A shuffling sampler also
    needs the epoch, or every epoch replays one order (LD201): the fix inserts
    `loader.sampler.set_epoch(epoch)` at the start of each epoch loop, or, when
    the loader is rebuilt inside the epoch loop, passes `seed=epoch` (the
    sampler shuffles with `seed + epoch`, so both give the same orders). No fix
    when the dataset is not a plain name or attribute (it would be evaluated
    twice), when `shuffle` is passed by position, when an epoch loop has no
    usable counter, when the loader has no name at the epoch loop, or when a
    shuffling loader is read with `next(iter(loader))` (where a new pass
    starts is not a loop lintdist sees, so it cannot tell the sampler the
    epoch). The fix does not reformat: a long `DataLoader(...)` line may need
    rewrapping.

    The `shuffle=sampler` slip has a safe fix: the keyword becomes `sampler=`
    (what the script meant; the loader then shards and stops shuffling by
    itself).

    ## References
    - `torch.utils.data.distributed.DistributedSampler` (its docstring: "useful
      in conjunction with DistributedDataParallel ... each process can pass a
      DistributedSampler instance as a DataLoader sampler")
    - PyTorch tutorial "Getting Started with Distributed Data Parallel" and the
      `ddp-tutorial-series` examples (`multigpu.py`)
    - accelerate `accelerate/data_loader.py`, `prepare_data_loader` (why
      accelerate loaders need no sampler)
    """

    code = "LD203"
    name = "ddp-loader-without-distributed-sampler"
    severity = Severity.ERROR
    needs_several_processes = True
    fix_kind = "unsafe"
    # the loader, or a loader made in another module of the project (`from data import build_loader`)
    triggers = ("DataLoader", Pattern(("loader",), IMPORTED_LOADER))
    # a wrapper needs its import, so its real name is in the text even when it is used as `DDP`/`FSDP`
    also_triggers = (WRAPPER_NAMES,)

    VALID = (
        Valid(
            """\
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

dist.init_process_group("gloo")
model = DDP(model)
sampler = DistributedSampler(dataset)
loader = DataLoader(dataset, batch_size=16, sampler=sampler)
for epoch in range(3):
    sampler.set_epoch(epoch)
    for x, y in loader:
        loss_fn(model(x), y).backward()
"""
        ),
        Valid(
            """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, IterableDataset


class TokenStream(IterableDataset):
    def __iter__(self):
        yield from read_shard(dist.get_rank())


dist.init_process_group("gloo")
model = DDP(model)
loader = DataLoader(TokenStream(), batch_size=16)
for batch in loader:
    model(batch).sum().backward()
"""
        ),
        Valid(
            """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

dist.init_process_group("gloo")
model = DDP(model)
train_loader = DataLoader(train_set, batch_size=16, sampler=DistributedSampler(train_set))
eval_loader = DataLoader(eval_set, batch_size=64)
with torch.no_grad():
    for x, y in eval_loader:
        total += (model(x).argmax(1) == y).sum()
"""
        ),
        Valid(
            """\
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = DDP(model)
loader = DataLoader(dataset[rank::world], batch_size=16, shuffle=True)
for x, y in loader:
    loss_fn(model(x), y).backward()
"""
        ),
        Valid(
            """\
import torch.distributed as dist
from datasets import load_dataset
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader

dist.init_process_group("nccl")
fully_shard(model)
stream = load_dataset("allenai/c4", "en", split="train", streaming=True)
for batch in DataLoader(stream.with_format("torch"), batch_size=8):
    model(batch["input_ids"]).loss.backward()
"""
        ),
        Valid(
            """\
from accelerate import Accelerator
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

if args.raw:
    model = DDP(model)
accelerator = Accelerator()
loader = DataLoader(dataset, batch_size=16, shuffle=True)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for x, y in loader:
    accelerator.backward(loss_fn(model(x), y))
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

dist.init_process_group("nccl")
model = DDP(build_model())
sampler = DistributedSampler(dataset)
loader = DataLoader(dataset, batch_size=16, shuffle=sampler)
for epoch in range(epochs):
    sampler.set_epoch(epoch)
    for batch in loader:
        model(batch).sum().backward()
""",
            lines=(8,),
            fixed="""\
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

dist.init_process_group("nccl")
model = DDP(build_model())
sampler = DistributedSampler(dataset)
loader = DataLoader(dataset, batch_size=16, sampler=sampler)
for epoch in range(epochs):
    sampler.set_epoch(epoch)
    for batch in loader:
        model(batch).sum().backward()
""",
        ),
        Invalid(
            """\
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

dist.init_process_group("gloo")
model = DDP(model)
loader = DataLoader(dataset, batch_size=16, shuffle=True)
for epoch in range(3):
    for x, y in loader:
        loss_fn(model(x), y).backward()
        optimizer.step()
""",
            lines=(7,),
            unsafe_fixed="""\
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler, DataLoader

dist.init_process_group("gloo")
model = DDP(model)
loader = DataLoader(dataset, batch_size=16, sampler=DistributedSampler(dataset, shuffle=True))
for epoch in range(3):
    loader.sampler.set_epoch(epoch)
    for x, y in loader:
        loss_fn(model(x), y).backward()
        optimizer.step()
""",
        ),
        Invalid(
            """\
import torch.distributed as dist
import torch.utils.data as tud
from torch.distributed.fsdp import fully_shard
from torch.utils.data.distributed import DistributedSampler as DS


def train(model, data, epochs):
    for epoch in range(epochs):
        for batch in tud.DataLoader(data, 8):
            model(batch).sum().backward()


dist.init_process_group("gloo")
fully_shard(model)
train(model, dataset, 4)
""",
            lines=(9,),
            unsafe_fixed="""\
import torch.distributed as dist
import torch.utils.data as tud
from torch.distributed.fsdp import fully_shard
from torch.utils.data.distributed import DistributedSampler as DS


def train(model, data, epochs):
    for epoch in range(epochs):
        for batch in tud.DataLoader(data, 8, sampler=DS(data, shuffle=False)):
            model(batch).sum().backward()


dist.init_process_group("gloo")
fully_shard(model)
train(model, dataset, 4)
""",
        ),
        Invalid(
            """\
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

dist.init_process_group("gloo")
model = DistributedDataParallel(model)
loader = DataLoader(build_dataset(), batch_size=16, shuffle=True)
for x, y in loader:
    loss_fn(model(x), y).backward()
""",
            lines=(7,),
        ),
    )

    def finish(self) -> None:
        typos = {id(call) for call in self.facts.calls if self._sampler_as_shuffle(call)}
        wrappers = self._wrappers()
        if not wrappers:
            return
        # DataLoader(...) call -> the training loops that iterate it, with the loader's expression there
        found: dict[int, tuple[cst.Call, list[Use]]] = {}
        for use in self._training_iterations():
            for loader in loader_calls(self.facts, use.expr, use.loop):
                if not (plain_loader(self.facts, loader) and without_sampler(loader)):
                    continue
                if any(run_together(self.facts, use.loop, wrapper) for wrapper in wrappers):
                    found.setdefault(id(loader), (loader, []))[1].append(use)
        for loader, uses in found.values():
            if id(loader) in typos or self._split_elsewhere(loader):
                continue
            self._report(loader, uses)

    def _sampler_as_shuffle(self, call: cst.Call) -> bool:
        """``DataLoader(ds, shuffle=sampler)``, a typo for ``sampler=sampler``: a sampler object is true, so the
        loader shuffles the whole dataset itself on every rank and the sampler is never used."""
        facts = self.facts
        shuffle = next((a for a in call.args if a.keyword is not None and a.keyword.value == "shuffle"), None)
        if shuffle is None or not plain_loader(facts, call):
            return False
        if argument_of(call, "sampler", 3) is not None or argument_of(call, "batch_sampler", 4) is not None:
            return False
        if not any(o.index is None and torch_sampler(facts, o.node) for o in facts.origins(shuffle.value, call)):
            return False
        code = self.context.module.code_for_node(shuffle.value)
        message = (
            f"`shuffle={code}` passes a sampler where a flag belongs: the sampler is true, so the loader shuffles "
            "the whole dataset itself on every rank and never uses it (each rank trains on all the data); pass "
            f"`sampler={code}`"
        )
        fix = Fix(
            Applicability.SAFE,
            f"Pass `sampler={code}`",
            replacements=((shuffle, shuffle.with_changes(keyword=cst.Name("sampler"))),),
        )
        self.report(shuffle, message, fix=fix)
        return True

    def _wrappers(self) -> list[cst.Call]:
        """``facts.wrapped_models()``, asked only when some call is spelled like a wrapper or an alias of
        one (resolving every call's name costs more than the rest of the rule in a file that wraps nothing)."""
        facts = self.facts
        aliases = facts.alias_spellings(frozenset(WRAPPER_NAMES))
        if aliases is None:
            return facts.wrapped_models()
        spellings = set(WRAPPER_NAMES) | aliases
        if not any((get_full_name_for_node(c.func) or "").rsplit(".", 1)[-1] in spellings for c in facts.calls):
            return []
        return facts.wrapped_models()

    # -- where a loader is trained on -------------------------------------------------------------

    def _training_iterations(self) -> list[Use]:
        """Loops that run a backward pass over a loader: ``for batch in loader`` (through ``enumerate``/
        ``tqdm``), or ``next(it)`` of ``it = iter(loader)`` inside the loop."""
        uses = [Use(loop, expr, stepped=False) for loop, expr in self.facts.data_loops()]
        uses += [Use(loop, inner, stepped=True) for loop, inner in self.facts.iterator_passes()]
        return [use for use in uses if self._trains_everywhere(use.loop)]

    def _trains_everywhere(self, loop: Loop) -> bool:
        """The loop runs a backward pass, not under ``no_grad`` and not on the main process only."""
        facts = self.facts
        return facts.trains(loop.body) and not facts.under_no_grad(loop) and facts.rank_guard(loop) is None

    # -- the traps: data split some other way -----------------------------------------------------

    def _split_elsewhere(self, loader: cst.Call) -> bool:
        facts = self.facts
        if facts.rank_guard(loader) is not None or framework_loader(facts, loader):
            return True
        return split_by_rank(facts, argument_of(loader, "dataset", 0), loader)

    # -- the report and its fix -----------------------------------------------------------------

    def _report(self, loader: cst.Call, uses: list[Use]) -> None:
        code = self.context.module.code_for_node
        dataset = argument_of(loader, "dataset", 0)
        dataset_text = code(dataset) if isinstance(dataset, (cst.Name, cst.Attribute)) else "dataset"
        shuffle = argument_of(loader, "shuffle", 2)
        shuffle_text = "False" if shuffle is None else code(shuffle)
        if len(shuffle_text) > 30:
            shuffle_text = "..."
        instead = "" if shuffle is None else " in place of `shuffle=`"
        epoch = "" if shuffle_text == "False" else ", and call `sampler.set_epoch(epoch)` at the start of each epoch"
        message = (
            "this DataLoader has no sampler in a raw DistributedDataParallel/FSDP script, so every rank iterates "
            "the whole dataset and the ranks train on copies of the same batches; pass "
            f"`sampler=DistributedSampler({dataset_text}, shuffle={shuffle_text})`{instead}{epoch}"
        )
        self.report(loader, message, fix=self._fix(loader, uses))

    def _fix(self, loader: cst.Call, uses: list[Use]) -> Fix | None:
        facts = self.facts
        code = self.context.module.code_for_node
        dataset = argument_of(loader, "dataset", 0)
        if not isinstance(dataset, (cst.Name, cst.Attribute)):
            return None
        positional = [arg for arg in loader.args if arg.keyword is None]
        shuffle_arg = next((a for a in loader.args if a.keyword is not None and a.keyword.value == "shuffle"), None)
        if len(positional) > 2 or (shuffle_arg is None and argument_of(loader, "shuffle", 2) is not None):
            return None
        sampler_name, imports = class_spelling(facts, SAMPLER_CLASSES, SAMPLER_MODULES, "torch.utils.data")
        if sampler_name is None:
            return None
        shuffle = code(shuffle_arg.value) if shuffle_arg is not None else "False"
        shuffles = shuffle != "False"
        # the epoch each shuffling sampler must be told: a statement in each epoch loop, or a seed
        insertions: list[tuple[Loop, str]] = []
        seed = None
        if shuffles:
            if any(use.stepped for use in uses):
                return None  # `next(iter(loader))`: where a pass over the data starts is not a loop lintdist sees
            for epoch_loop, loader_there in {
                id(e): (e, x) for use in uses for e, x in self._epochs(loader, use.loop, use.expr)
            }.values():
                epoch = epoch_counter(epoch_loop)
                if epoch is None or not isinstance(epoch_loop.body, cst.IndentedBlock):
                    return None
                if facts.is_within(loader, epoch_loop):
                    if facts.enclosing_function(loader) is not facts.enclosing_function(epoch_loop) or seed:
                        return None
                    seed = epoch
                    continue
                # the loader's name at the epoch loop, bound outside it (so the new first statement can read it)
                if fixed_name(facts, loader_there, epoch_loop) is None or not any(
                    o.node is loader for o in facts.origins(loader_there, epoch_loop)
                ):
                    return None
                insertions.append((epoch_loop, f"{code(loader_there)}.sampler.set_epoch({epoch})"))
        seed_text = f", seed={seed}" if seed else ""
        sampler = cst.parse_expression(f"{sampler_name}({code(dataset)}, shuffle={shuffle}{seed_text})")
        if shuffle_arg is not None:
            replacements = [(shuffle_arg, shuffle_arg.with_changes(keyword=cst.Name("sampler"), value=sampler))]
        elif (anchor := positional[-1] if positional else loader.args[-1]) is loader.args[-1] and isinstance(
            anchor.comma, cst.Comma
        ):
            return None  # a trailing comma: where the new line goes and how it is indented is unclear
        else:
            at = loader.args.index(anchor)  # after the positional arguments (all keywords: after the last)
            args = inserted_after(loader.args, at, keyword_arg("sampler", sampler), loader.whitespace_before_args)
            replacements = [(loader, loader.with_changes(args=args))]
        for epoch_loop, statement in insertions:
            body = epoch_loop.body
            replacements.append((body, body.with_changes(body=(cst.parse_statement(f"{statement}\n"), *body.body))))
        changed = [old for old, _ in replacements]
        if any(a is not b and facts.is_within(a, b) for a in changed for b in changed):
            return None  # nested edits would overwrite each other
        told = " and tell it the epoch" if insertions or seed else ""
        return Fix(
            Applicability.UNSAFE,
            f"Give the loader `sampler={sampler_name}({code(dataset)}, shuffle={shuffle})`{told}",
            replacements=tuple(replacements),
            imports=imports,
        )

    def _epochs(self, loader: cst.Call, loop: Loop, expr: cst.BaseExpression) -> list[tuple[Loop, cst.BaseExpression]]:
        """The epoch loops around a training loop that do not already tell a sampler the epoch."""
        facts = self.facts
        return [
            (epoch_loop, loader_there)
            for epoch_loop, loader_there in facts.epoch_loops(loop, expr)
            if not single_pass(epoch_loop)
            and not any(may_tell_epoch_of(facts, call, loader) for call in facts.reachable_calls(epoch_loop.body))
        ]
