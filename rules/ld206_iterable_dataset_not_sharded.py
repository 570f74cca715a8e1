"""LD206 iterable-dataset-not-sharded: every rank of a raw DDP job reads the same stream of an IterableDataset."""

from __future__ import annotations

import libcst as cst

from lintdist.callgraph import run_together
from lintdist.dataset_split import unsplit_iterable_class, unsplit_stream
from lintdist.facts import argument_of
from lintdist.loaders import framework_loader, loader_calls, plain_loader, without_sampler
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Rule, Valid

INIT_PROCESS_GROUP = frozenset(
    {"torch.distributed.init_process_group", "torch.distributed.distributed_c10d.init_process_group"}
)


class IterableDatasetNotSharded(Rule):
    """
    ## What it does
    Reports a `DataLoader` that a raw multi-process script (one that calls
    `init_process_group` or wraps its model in `DistributedDataParallel`,
    `FullyShardedDataParallel` or `fully_shard`) trains on, when its dataset
    is a stream that nothing splits by rank:
    - a `datasets` stream (`load_dataset(..., streaming=True)`,
      `.to_iterable_dataset()`, `IterableDataset.from_generator`, and
      `.map`/`.filter`/`.shuffle`/`.with_format` of one) never passed
      through `split_dataset_by_node` or `.shard`;
    - or a `torch.utils.data.IterableDataset` subclass of the script whose
      code (its `__iter__`, `__init__`, its bases in the file and the
      file's functions they call) never reads the rank or the world size,
      constructed with no rank-dependent argument.

    Not reported: a loader passed to `accelerator.prepare`, Fabric's
    `setup_dataloaders` or a Lightning `Trainer`; a loader only iterated
    in evaluation or under a rank guard; a class that reads the rank
    anywhere (`dist.get_rank()`, `RANK`, `world_size`,
    `itertools.islice(it, rank, None, world)`), derives from a class of
    another module, or is given a rank-split argument; WebDataset,
    torchdata and other streaming libraries (they have their own node
    splitters); a dataset whose origin lintdist cannot follow.

    ## Why is this bad?
    A `DataLoader` cannot take a sampler with an `IterableDataset`, so
    `DistributedSampler` is not there to split the data: each process
    iterates the whole stream. A `datasets` stream splits its shards across
    the loader's *workers* (`torch.utils.data.get_worker_info()`), never
    across ranks, unless `split_dataset_by_node` was applied. A subclass
    that uses only `get_worker_info()` has the same flaw. Every rank then
    trains on the same batches in the same order: DDP averages W identical
    gradients, an epoch of W ranks is worth one rank's, and nothing warns.

    ## Example
    ```python
    dist.init_process_group("nccl")
    model = DDP(model.to(local_rank), device_ids=[local_rank])
    stream = load_dataset("allenai/c4", "en", split="train", streaming=True)
    loader = DataLoader(stream.with_format("torch"), batch_size=8)
    for batch in loader:
        model(**batch).loss.backward()
    ```

    ## Use instead
    ```python
    dist.init_process_group("nccl")
    model = DDP(model.to(local_rank), device_ids=[local_rank])
    stream = load_dataset("allenai/c4", "en", split="train", streaming=True)
    stream = split_dataset_by_node(stream, rank=dist.get_rank(), world_size=dist.get_world_size())
    loader = DataLoader(stream.with_format("torch"), batch_size=8)
    for batch in loader:
        model(**batch).loss.backward()
    ```

    ## Fix safety
    Unsafe (`--unsafe-fixes`), for a `datasets` stream in a script that
    calls `init_process_group`: the loader's dataset becomes
    `split_dataset_by_node(ds, rank=dist.get_rank(),
    world_size=dist.get_world_size())` (imported from
    `datasets.distributed`). Each rank then reads 1/W of the stream, so the
    number of steps per epoch and what is logged change; a shuffled stream
    must use the same seed on every rank (datasets' docstring); the process
    group must exist where the loader is built; and when the stream's
    shard count does not divide by W, each rank reads every W-th example
    of all shards. No fix for a subclass of the script: where its
    `__iter__` should split (files, lines, examples) is the author's
    choice.

    ## References
    - datasets `src/datasets/iterable_dataset.py::IterableDataset._iter_pytorch`
      (shards split by `get_worker_info()`; the rank used only when
      `_distributed` is set) and `src/datasets/distributed.py::split_dataset_by_node`
      (the one setter of `_distributed`)
    - torch 2.13 `torch/utils/data/dataloader.py::DataLoader.__init__`
      (an `IterableDataset` takes no sampler)
    - accelerate 1.15 `accelerate/data_loader.py::prepare_data_loader`:
      `dispatch_batches` defaults to `isinstance(dataset, IterableDataset)`,
      so a prepared stream becomes a `DataLoaderDispatcher` (rank 0 reads and
      slices each batch to the ranks); with `dispatch_batches=False` it is
      wrapped in `IterableDatasetShard` (or `.shard` for a datasets stream)
    - https://github.com/huggingface/datasets/issues/5360: "IterableDataset
      returns duplicated data using PyTorch DDP"; fixed by adding
      `split_dataset_by_node` (PR 5369)
    - https://github.com/Smith42/astroPT/pull/64: the streaming path never
      sharded across DDP processes, every rank iterated the identical
      stream; fixed with `split_dataset_by_node`
    - https://github.com/huggingface/transformers/pull/11254: the Trainer
      trained on the same data on all processes until `IterableDatasetShard`
    - Proof: tests/proofs/test_ld206_duplicated_stream.py (gloo, 2 ranks):
      an IterableDataset whose `__iter__` reads only `get_worker_info` gives
      both ranks the same 16 samples; the one that slices by rank gives
      them disjoint halves
    """

    code = "LD206"
    name = "iterable-dataset-not-sharded"
    severity = Severity.WARNING
    needs_several_processes = True
    fix_kind = "unsafe"
    # the words other rules test too come first: a file without them is passed over at no cost
    triggers = ("init_process_group", "DistributedDataParallel", "FullyShardedDataParallel", "fully_shard")
    also_triggers = (("DataLoader",), ("IterableDataset", "streaming", "to_iterable_dataset"))

    VALID = (
        Valid(
            """\
import torch.distributed as dist
from datasets import load_dataset
from datasets.distributed import split_dataset_by_node
from torch.utils.data import DataLoader

dist.init_process_group("nccl")
stream = load_dataset("allenai/c4", "en", split="train", streaming=True)
stream = split_dataset_by_node(stream, rank=dist.get_rank(), world_size=dist.get_world_size())
for batch in DataLoader(stream.with_format("torch"), batch_size=8):
    model(**batch).loss.backward()
"""
        ),
        Valid(
            """\
import itertools

import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset


class Lines(IterableDataset):
    def __init__(self, path):
        self.path = path

    def __iter__(self):
        with open(self.path) as f:
            yield from itertools.islice(f, dist.get_rank(), None, dist.get_world_size())


dist.init_process_group("gloo")
for batch in DataLoader(Lines("train.txt"), batch_size=8):
    model(batch).sum().backward()
"""
        ),
        Valid(
            """\
from accelerate import Accelerator
from datasets import load_dataset
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

accelerator = Accelerator()
stream = load_dataset("allenai/c4", "en", split="train", streaming=True)
loader = accelerator.prepare(DataLoader(stream, batch_size=8))
for batch in loader:
    accelerator.backward(model(**batch).loss)
"""
        ),
        Valid(
            """\
import torch
import torch.distributed as dist
from datasets import load_dataset
from torch.utils.data import DataLoader

dist.init_process_group("nccl")
stream = load_dataset("allenai/c4", "en", split="validation", streaming=True)
with torch.no_grad():
    for batch in DataLoader(stream, batch_size=8):
        total += model(**batch).loss
"""
        ),
        Valid(
            """\
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset


class Shards(IterableDataset):
    def __init__(self, files):
        self.files = files

    def __iter__(self):
        for name in self.files:
            yield from read(name)


dist.init_process_group("gloo")
mine = all_files[dist.get_rank()::dist.get_world_size()]
for batch in DataLoader(Shards(mine), batch_size=8):
    model(batch).sum().backward()
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
import torch.distributed as dist
from datasets import load_dataset
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

dist.init_process_group("nccl")
model = DDP(model)
stream = load_dataset("allenai/c4", "en", split="train", streaming=True)
loader = DataLoader(stream, batch_size=8)
for batch in loader:
    model(**batch).loss.backward()
""",
            lines=(9,),
            unsafe_fixed="""\
import torch.distributed as dist
from datasets import load_dataset
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from datasets.distributed import split_dataset_by_node

dist.init_process_group("nccl")
model = DDP(model)
stream = load_dataset("allenai/c4", "en", split="train", streaming=True)
loader = DataLoader(split_dataset_by_node(stream, rank=dist.get_rank(), world_size=dist.get_world_size()), batch_size=8)
for batch in loader:
    model(**batch).loss.backward()
""",
        ),
        Invalid(
            """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, get_worker_info


class TokenStream(IterableDataset):
    def __init__(self, files):
        self.files = files

    def __iter__(self):
        info = get_worker_info()
        files = self.files if info is None else self.files[info.id :: info.num_workers]
        for name in files:
            yield from torch.load(name)


def main():
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(build_model())
    loader = DataLoader(TokenStream(FILES), batch_size=16, num_workers=2)
    for batch in loader:
        model(batch).sum().backward()
""",
            lines=(20,),
        ),
    )

    def finish(self) -> None:
        facts = self.facts
        starts = [c for c in facts.calls if facts.callee_is(c, INIT_PROCESS_GROUP)] + facts.wrapped_models()
        if not starts:
            return
        reported: set[int] = set()
        passes = [*facts.data_loops(), *facts.iterator_passes()]  # `for batch in loader`, `next(it)` of `iter(loader)`
        for loop, expr in passes:
            if not facts.trains(loop.body) or facts.under_no_grad(loop) or facts.rank_guard(loop) is not None:
                continue
            if not any(run_together(facts, loop, start) for start in starts):
                continue
            for loader in loader_calls(facts, expr, loop):
                if id(loader) in reported or not (plain_loader(facts, loader) and without_sampler(loader)):
                    continue
                dataset = argument_of(loader, "dataset", 0)
                if dataset is None or facts.rank_guard(loader) is not None or framework_loader(facts, loader):
                    continue
                stream = unsplit_stream(facts, dataset, loader)
                if stream is not None:
                    reported.add(id(loader))
                    self._report(loader, dataset, stream)

    def _report(self, loader: cst.Call, dataset: cst.BaseExpression, stream: cst.Call) -> None:
        facts = self.facts
        cls = unsplit_iterable_class(facts, stream)
        if cls is not None:
            message = (
                f"`{cls.name.value}` is an IterableDataset whose code never reads the rank, and a DataLoader "
                "cannot shard it with a sampler: every rank iterates the same stream and trains on the same "
                "batches; split it by rank in `__iter__` (e.g. "
                "`itertools.islice(it, dist.get_rank(), None, dist.get_world_size())`)"
            )
            self.report(loader, message)
            return
        message = (
            "this DataLoader reads a `datasets` stream that is split across the loader's workers only, never "
            "across ranks: every rank iterates the same stream and trains on the same batches; wrap it with "
            "`split_dataset_by_node(ds, rank=..., world_size=...)` from `datasets.distributed`"
        )
        self.report(loader, message, fix=self._fix(loader, dataset))

    def _fix(self, loader: cst.Call, dataset: cst.BaseExpression) -> Fix | None:
        facts = self.facts
        dist = facts.distributed_at(loader)
        if dist is None or not any(facts.callee_is(c, INIT_PROCESS_GROUP) for c in facts.calls):
            return None
        # every value a stream: `split_dataset_by_node` of a branch's map-style torch dataset would fail
        if not all(unsplit_stream(facts, o.node, loader) for o in facts.origins(dataset, loader)):
            return None
        code = self.context.module.code_for_node(dataset)
        wrapped = cst.parse_expression(
            f"split_dataset_by_node({code}, rank={dist}.get_rank(), world_size={dist}.get_world_size())"
        )
        return Fix(
            Applicability.UNSAFE,
            "Split the stream by rank with `split_dataset_by_node`",
            replacements=((dataset, wrapped),),
            imports=(("datasets.distributed", "split_dataset_by_node"),),
        )
