"""LD401 prep-outside-main-process-first: every rank downloads or preprocesses the same dataset at once."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import (
    ACCELERATOR_CLASSES,
    DDP_CLASSES,
    MAX_CALLER_DEPTH,
    MAX_DEPTH,
    RANK_GETTERS,
    RANK_NAMES,
    argument_of,
    barrier_unsafe,
)
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Pattern, Rule, Valid

LOAD_DATASET = frozenset({"datasets.load_dataset", "datasets.load.load_dataset"})
DOWNLOADS = frozenset(
    {
        "torch.hub.load",
        "torch.hub.list",
        "torch.hub.download_url_to_file",
        "urllib.request.urlretrieve",
    }
)
DOWNLOADING_DATASET_PACKAGES = ("torchvision.datasets.", "torchaudio.datasets.")
# Dataset methods that return a dataset (so `.map` on their result still writes the same cache).
DATASET_METHODS = frozenset(
    {
        "map",
        "filter",
        "shuffle",
        "select",
        "select_columns",
        "remove_columns",
        "rename_column",
        "rename_columns",
        "train_test_split",
        "cast",
        "cast_column",
        "class_encode_column",
        "flatten",
        "sort",
        "with_format",
    }
)
ACCELERATE_SCRIPT = ACCELERATOR_CLASSES | {
    "accelerate.PartialState",
    "accelerate.state.PartialState",
    "accelerate.notebook_launcher",
    "accelerate.launchers.notebook_launcher",
}
TORCH_SCRIPT = frozenset(
    {
        "torch.nn.parallel.DistributedDataParallel",
        "torch.multiprocessing.spawn",
        "torch.utils.data.DistributedSampler",
        "torch.utils.data.distributed.DistributedSampler",
        "deepspeed.initialize",
        "deepspeed.init_distributed",
    }
)
# Calls that create the default process group (DeepSpeed's create it when none exists).
INIT_PROCESS_GROUP = frozenset(
    {"torch.distributed.init_process_group", "deepspeed.initialize", "deepspeed.init_distributed"}
)
# Calls that must not end up inside the ordered block: the other ranks would wait at them forever.
SYNCHRONIZING = frozenset(
    {"barrier", "wait_for_everyone", "all_reduce", "all_gather", "broadcast", "broadcast_object_list", "prepare"}
)
# Calls that must stay out of the ordered block too: collectives (the main process would wait in them while the
# others wait at the block's barrier), and model loading that turns collective under DeepSpeed ZeRO-3 (`zero.Init`).
UNWRAPPABLE = SYNCHRONIZING | {
    "monitored_barrier",
    "all_gather_object",
    "all_gather_into_tensor",
    "gather",
    "gather_object",
    "gather_for_metrics",
    "scatter",
    "scatter_object_list",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "new_group",
    "pad_across_processes",
    "check_trigger",
    "save_state",
    "load_state",
    "save_model",
    "get_state_dict",
    "save_checkpoint",
    "prepare_model",
    "initialize",
    "from_pretrained",
    "from_config",
    "fully_shard",
    "DistributedDataParallel",
    "FullyShardedDataParallel",
    "DDP",
    "FSDP",
}
STATE_CLASSES = ACCELERATOR_CLASSES | {"accelerate.PartialState", "accelerate.state.PartialState"}
RUNTIME_IMPORT = ("lintdist.runtime", "main_process_first")
STATE_IMPORT = ("accelerate", "PartialState")
# `Accelerator(...)` keywords that do not reach `PartialState` (accelerate 1.15: `AcceleratorState` passes `cpu` and
# the process-group kwargs handlers to it, and a DeepSpeed plugin selects the backend through the environment).
STATE_NEUTRAL_KEYWORDS = frozenset(
    {
        "gradient_accumulation_steps",
        "gradient_accumulation_plugin",
        "mixed_precision",
        "log_with",
        "project_dir",
        "project_config",
        "step_scheduler_with_optimizer",
        "split_batches",
        "dispatch_batches",
        "even_batches",
        "rng_types",
        "device_placement",
    }
)
BARRIER_METHODS = frozenset({"barrier", "wait_for_everyone"})
# Lightning runs `prepare_data` on one process per node and orders `setup` after it: not this rule's scope.
LIGHTNING_PACKAGES = ("lightning", "pytorch_lightning")
REMOTE_PREFIXES = ("http://", "https://", "hf://", "s3://", "gs://")
# Cache folders on a remote filesystem, where datasets 5.2 takes no file lock (`builder.py`: `FileLock` only when local).
REMOTE_CACHES = ("s3://", "gs://", "gcs://", "az://", "abfs://", "hf://")
# What each kind of call does on every rank at once: (what it does, what that costs, what ordering gives).
KINDS = {
    "map": (
        "recomputes the preprocessing",
        (
            "datasets checks its cache file only before computing, so every rank starting together computes it in "
            "full (duplicate work), each into a temporary file it then moves (nothing is corrupted)"
        ),
        "the main process writes the cache file and the other ranks load it",
    ),
    "torchvision": (
        "downloads the dataset",
        "torchvision downloads and extracts the archive with no lock, so a rank can read it half-written",
        "the main process downloads it and the other ranks find it complete",
    ),
    "hub": (
        "downloads the repository",
        "every rank deletes and re-extracts the same repository folder (`torch.hub._get_cache_or_reload`), a race",
        "the main process fills the hub cache and the other ranks reuse it",
    ),
    "url": (
        "downloads files",
        "every rank downloads the same file and writes it at the same time",
        "the main process downloads them and the other ranks find them",
    ),
    "remote_cache": (
        "downloads and prepares the dataset into a cache on a remote filesystem",
        "datasets takes its file lock only on a local cache, so every rank downloads and prepares it",
        "the main process prepares it and the other ranks find it",
    ),
}


class PrepOutsideMainProcessFirst(Rule):
    """
    ## What it does
    Reports dataset preparation that every rank of an accelerate or
    `torch.distributed` script runs at the same time and that is not safe or
    not cheap that way: `Dataset.map`/`.filter` on a dataset read with
    `datasets.load_dataset` (also through a variable or parameter bound to
    it, `loader = load_from_disk if cached else load_dataset`; unless
    `keep_in_memory=True`, or `load_from_cache_file=False`, where every rank
    computes its own copy whatever the order), `torchvision`/`torchaudio`
    datasets built with
    `download=True`, `torch.hub.load`/`list`/`download_url_to_file` and
    `urllib.request.urlretrieve`. `load_dataset` itself is reported only
    with a cache on a remote filesystem (`cache_dir="s3://..."`,
    `storage_options=`), as information. Calls inside
    `main_process_first()`, `local_main_process_first()`, a main-process
    branch, or the rank-0-first `dist.barrier()` pair are not reported, nor
    are helpers called only from there. The report points at the mapping or
    downloading call, once per run of consecutive statements (the message
    counts the others). A call in a class's constructor (or a method only
    the constructor calls) with no accelerator in reach there is reported at
    each unordered construction of that class in the file
    (`train_set = CaptionDataset(...)`), and in the constructor when the file
    constructs it nowhere.

    ## Why is this bad?
    `Dataset.map` checks for its cache file only before it computes, so every
    rank that starts together computes the whole map: N times the work
    (each rank writes a temporary file and moves it into place, so nothing is
    corrupted). torchvision downloads and extracts its archives with no lock,
    so one rank can read a half-written archive, and `torch.hub` deletes and
    re-extracts the repository folder on every rank. Letting the main process
    go first makes the others load the cache from disk. `load_dataset` alone
    is not reported: datasets 5.2's `DatasetBuilder.download_and_prepare`
    takes a file lock on a local cache, and a rank that gets it after the
    data exists logs "Found cached dataset" and returns, so nothing is
    downloaded or prepared twice. Nor are `load_from_disk`, streaming
    datasets, model or tokenizer `from_pretrained` (file-locked by the hub
    client), per-rank downloads (a rank in the target path, `cache_dir` or
    the loop's items) and Lightning scripts (`prepare_data` runs once per
    node).

    ## Example
    ```python
    accelerator = Accelerator()
    raw = load_dataset("glue", "mrpc")
    tokenized = raw.map(tokenize, batched=True)
    ```

    ## Use instead
    ```python
    accelerator = Accelerator()
    raw = load_dataset("glue", "mrpc")
    with accelerator.main_process_first():
        tokenized = raw.map(tokenize, batched=True)
    ```

    ## Fix safety
    Safe: the block still runs on every rank, the main process first, and a
    `with` block keeps every name it binds visible after it. One fix wraps
    the run of consecutive simple statements that holds the reported calls
    (and the plain statements between them) in one block:
    `with <accelerator>.main_process_first():` with the script's own
    accelerator or `PartialState` expression (`accelerator`, `self.accelerator`,
    a parameter annotated `Accelerator`, a closure variable, one built in a
    conditional expression). When that expression may be None
    (`Accelerator() if n > 1 else None`, an `accelerator=None` parameter) it
    uses `lintdist.runtime.main_process_first(accelerator=...)`, which orders
    through the accelerator when there is one, through `torch.distributed`
    otherwise, and just runs the block without a process group. In a raw
    `torch.distributed` script, and in an accelerate helper with no
    accelerator in reach but an `Accelerator`/`PartialState` created before
    it runs (earlier in its function or before every call site), it uses
    `lintdist.runtime.main_process_first()` (exception-safe) and adds that
    import. That fix is unsafe when lintdist cannot tell whether the process
    group exists by then. For a class whose constructor downloads or maps,
    the fix wraps that call in the constructor (once, however many
    constructions are reported), not the construction (unless the
    construction sits in a run with other reported calls): the rest of the
    constructor, which may decode every example into memory, then runs on
    all ranks at once. Every block adds a barrier, so a fix is offered
    only where every rank provably reaches it: every caller of the enclosing
    function, in this file and in the project's other modules, is known and
    none sits under a rank test (a helper no visible code calls gets no fix,
    and the message says why; one called only under `if is_master(args):`
    in another module is not reported at all). When the script builds its `Accelerator` (or
    `PartialState`) only after the call, later in the same function or
    module, the fix wraps the call in
    `with PartialState().main_process_first():` (importing `PartialState`
    from accelerate). That fix is unsafe: it starts the process group at the
    call instead of at the accelerator. It is offered only where that makes no
    other difference: every `Accelerator(...)` of the script passes only
    keywords that do not reach `PartialState` (not `cpu=`, which accelerate
    1.15 refuses on a state already set up on a GPU, not `kwargs_handlers`,
    which carry the process-group options, not a DeepSpeed plugin, which
    picks the backend through the environment) and nothing else starts a
    group. No fix is offered when an `init_process_group` starts the group only
    after the call (the block would order nothing), when the function is also
    called from a main-process-only
    branch, when the call is part of a compound statement's header, or when
    the statements would pull into the block a collective, a model load
    (`from_pretrained` gathers parameters under DeepSpeed ZeRO-3), a
    DDP/FSDP wrapper or a `yield`.

    ## References
    - accelerate `PartialState.main_process_first` and `local_main_process_first`
    - `datasets` documentation, "Cache management" and "Process" (multiprocess `map`); datasets 5.2.0
      `builder.py` (`FileLock(<output_dir>_builder.lock)` in `download_and_prepare`)
    - `torch.hub._get_cache_or_reload` (removes and re-extracts the repository folder)
    - transformers `TrainingArguments.main_process_first`, used by its examples around `map`
    """

    code = "LD401"
    name = "prep-outside-main-process-first"
    severity = Severity.WARNING
    fix_kind = "safe"
    # `load_dataset` imported (not in a `>>>` docstring line) or called through `datasets.`; `torch.hub`;
    # `urlretrieve`; a torchvision/torchaudio dataset built with `download=True`
    triggers = (
        Pattern(
            ("load_dataset",),
            re.compile(r"^[ \t]*from\s+datasets(?:\.load)?\s+import\s*\(?[\w\s,]*?\bload_dataset\b", re.MULTILINE),
        ),
        "datasets.load_dataset",
        "torch.hub",
        Pattern(("from torch import",), re.compile(r"from\s+torch\s+import\s*\(?[\w\s,]*?\bhub\b")),
        "urlretrieve",
        re.compile(r"download(?<!\wdownload)\s*=\s*\(*\s*True\b"),
    )
    # A helper module that downloads is distributed when the script calling it is (`_framework_of_callers`):
    # no distributed marker is required in the file itself.

    VALID = (
        Valid(
            """\
from accelerate import Accelerator
from datasets import load_dataset

accelerator = Accelerator()
raw = load_dataset("glue", "mrpc")  # datasets locks its local cache: the other ranks find it prepared
"""
        ),
        Valid(
            """\
from accelerate import Accelerator
from datasets import load_dataset

accelerator = Accelerator()
with accelerator.main_process_first():
    raw = load_dataset("glue", "mrpc")
    tokenized = raw.map(tokenize, batched=True)
"""
        ),
        Valid(
            """\
import torch.distributed as dist
from datasets import load_dataset, load_from_disk

dist.init_process_group("gloo")
local = load_dataset("json", data_files="train.jsonl")
cached = load_from_disk("cache/")
tokenized = cached.map(tokenize, keep_in_memory=True)
streamed = load_dataset("c4", "en", streaming=True).map(tokenize)
"""
        ),
        Valid(
            """\
import torch.distributed as dist
import torchvision

dist.init_process_group("gloo")
if dist.get_rank() != 0:
    dist.barrier()
train = torchvision.datasets.MNIST("data", download=True)
if dist.get_rank() == 0:
    dist.barrier()
"""
        ),
        Valid(
            """\
from accelerate import Accelerator
from datasets import load_dataset, load_from_disk
from torch.utils.data import Dataset


class Captions(Dataset):
    def __init__(self, name):
        self.rows = list(load_dataset(name, split="train"))


accelerator = Accelerator(log_with="wandb") if track else Accelerator()
reader = load_from_disk if cached else load_dataset
with accelerator.main_process_first():
    captions = Captions("acme/captions")
    corpus = reader("acme/corpus")
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
from accelerate import Accelerator
from datasets import load_dataset as ld

accelerator = Accelerator()
# the GLUE MRPC task
raw = ld("glue", "mrpc")
columns = raw["train"].column_names  # kept beside the data
tokenized = raw.map(tokenize, batched=True, remove_columns=columns)
model = accelerator.prepare(model)
""",
            lines=(8,),
            fixed="""\
from accelerate import Accelerator
from datasets import load_dataset as ld

accelerator = Accelerator()
# the GLUE MRPC task
raw = ld("glue", "mrpc")
columns = raw["train"].column_names  # kept beside the data
with accelerator.main_process_first():
    tokenized = raw.map(tokenize, batched=True, remove_columns=columns)
model = accelerator.prepare(model)
""",
        ),
        Invalid(
            """\
import torch.distributed as dist
from torchvision import datasets


def build(root):
    return datasets.CIFAR10(root, train=True, download=True)


def main():
    dist.init_process_group("gloo")
    train = build("data")


if __name__ == "__main__":
    main()
""",
            lines=(6,),
            fixed="""\
import torch.distributed as dist
from torchvision import datasets
from lintdist.runtime import main_process_first


def build(root):
    with main_process_first():
        return datasets.CIFAR10(root, train=True, download=True)


def main():
    dist.init_process_group("gloo")
    train = build("data")


if __name__ == "__main__":
    main()
""",
        ),
        Invalid(
            """\
from datasets import load_dataset
from accelerate import Accelerator

tokens = load_dataset("imdb").map(tokenize, batched=True)
accelerator = Accelerator()
""",
            lines=(4,),
            unsafe_fixed="""\
from datasets import load_dataset
from accelerate import PartialState, Accelerator

with PartialState().main_process_first():
    tokens = load_dataset("imdb").map(tokenize, batched=True)
accelerator = Accelerator()
""",
        ),
        Invalid(
            """\
from accelerate import Accelerator
from datasets import load_dataset, load_from_disk
from torch.utils.data import Dataset


class Captions(Dataset):
    def __init__(self, name):
        self.rows = self._rows(name)

    def _rows(self, name):
        return list(load_dataset(name, split="train").filter(has_caption))


def main(cached):
    accelerator = Accelerator(log_with="wandb") if cached else Accelerator()
    reader = load_from_disk if cached else load_dataset
    captions = Captions("acme/captions")
    corpus = reader("acme/corpus").map(normalize)
    shards = load_dataset("parquet", data_files={"train": f"hf://datasets/acme/{cached}/0.parquet"})


main(cached=False)
""",
            lines=(17,),
            fixed="""\
from accelerate import Accelerator
from datasets import load_dataset, load_from_disk
from torch.utils.data import Dataset


class Captions(Dataset):
    def __init__(self, name):
        self.rows = self._rows(name)

    def _rows(self, name):
        return list(load_dataset(name, split="train").filter(has_caption))


def main(cached):
    accelerator = Accelerator(log_with="wandb") if cached else Accelerator()
    reader = load_from_disk if cached else load_dataset
    with accelerator.main_process_first():
        captions = Captions("acme/captions")
        corpus = reader("acme/corpus").map(normalize)
    shards = load_dataset("parquet", data_files={"train": f"hf://datasets/acme/{cached}/0.parquet"})


main(cached=False)
""",
        ),
        Invalid(
            """\
import os

from accelerate import Accelerator
from datasets import load_dataset

accelerator = Accelerator() if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None
questions = load_dataset("acme/questions", split="test")
questions = questions.map(to_prompt)
""",
            lines=(8,),
            fixed="""\
import os

from accelerate import Accelerator
from datasets import load_dataset
from lintdist.runtime import main_process_first

accelerator = Accelerator() if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None
questions = load_dataset("acme/questions", split="test")
with main_process_first(accelerator=accelerator):
    questions = questions.map(to_prompt)
""",
        ),
    )

    def finish(self) -> None:
        self._fixed: set[int] = set()
        framework = self._framework()
        if framework is None and self.facts.project is None:
            return
        flagged = [(call, what) for call in self.facts.calls if (what := self._preparation(call)) is not None]
        if framework is None:
            # a helper module: distributed when the script that calls it is (the loader in `data.py`)
            framework = self._framework_of_callers([call for call, _ in flagged])
            if framework is None:
                return
        flagged = [(call, what) for call, what in flagged if not self._ordered(call, 0)]
        # `ds.filter(...).map(...)` is one chain: report its innermost step only.
        inner = {id(call) for call, _ in flagged}
        flagged = [
            (call, what)
            for call, what in flagged
            if not (
                isinstance(call.func, cst.Attribute)
                and any(id(n) in inner for n in self.facts.within(call.func.value, cst.Call))
            )
        ]
        # A download in a class's constructor is reported where the object is built (the constructor has no
        # accelerator); several downloads in one constructor make one report per construction.
        items: dict[int, _Item] = {}
        for call, what in flagged:
            sites = self._constructions(call)
            for anchor in sites or (call,):
                item = items.setdefault(id(anchor), _Item(anchor, what, [], call if sites else None))
                item.inner.append(call)
        statements = {id(s) for s in (self._statement(item.anchor) for item in items.values()) if s is not None}
        # One report per run of consecutive statements, fixed by one block.
        groups: dict[int, list[_Item]] = {}
        runs: dict[int, list[cst.SimpleStatementLine] | None] = {}
        order = self.facts.index.order
        for item in sorted(items.values(), key=lambda i: order(i.anchor)):
            statement = self._statement(item.anchor)
            run = self._run(statement, statements) if statement is not None else None
            key = id(run[0]) if run else id(item.anchor)
            groups.setdefault(key, []).append(item)
            runs[key] = run
        for key, group in groups.items():
            self._report(group, runs[key], framework)

    # -- scope --------------------------------------------------------------------------------

    def _framework(self) -> str | None:
        """ "accelerate" or "torch" for a distributed script (catalog section 4), else None."""
        facts = self.facts
        names = set().union(*(facts.qualified_names(call.func) for call in facts.calls))
        if names & ACCELERATE_SCRIPT:
            return "accelerate"
        if any(name.split(".")[0] in LIGHTNING_PACKAGES for name in names):
            return None
        if names & TORCH_SCRIPT or any(name.startswith("torch.distributed.") for name in names):
            return "torch"
        return None

    def _framework_of_callers(self, calls: list[cst.Call]) -> str | None:
        """The framework of the project's scripts that call the functions holding ``calls``."""
        facts = self.facts
        for call in calls:
            function = facts.enclosing_function(call)
            seen = 0
            while function is not None and seen <= MAX_CALLER_DEPTH:
                for site in facts.external_call_sites(function):
                    framework = self.elsewhere(site.facts)._framework()
                    if framework is not None:
                        return framework
                sites = facts.call_sites(function)
                function = facts.enclosing_function(sites[0]) if sites else None
                seen += 1
        return None

    # -- what downloads or preprocesses -------------------------------------------------------

    def _preparation(self, call: cst.Call) -> str | None:
        """How a call downloads or preprocesses a dataset (a key of ``KINDS``), or None."""
        facts = self.facts
        if self._is_load_dataset(call):
            # no path: a local module that shadows `datasets` (the real function requires one)
            if argument_of(call, "path", 0) is None:
                return None
            if _is_true(argument_of(call, "streaming", None)) or self._local_files(call):
                return None
            cache = argument_of(call, "cache_dir", None)
            if _per_rank(facts, cache):
                return None
            # datasets 5.2 locks a local cache (`DatasetBuilder.download_and_prepare`): a later rank finds the
            # prepared data and returns, so only a remote cache is prepared by every rank
            remote = _literal_startswith(cache, REMOTE_CACHES) or argument_of(call, "storage_options", None) is not None
            return "remote_cache" if remote else None
        names = facts.qualified_names(call.func)
        if names & DOWNLOADS:
            # `urlretrieve(url, f"shard{rank}.tar")`: each rank fetches its own file
            if any(_per_rank(facts, arg.value) for arg in call.args):
                return None
            return "hub" if any(n in ("torch.hub.load", "torch.hub.list") for n in names) else "url"
        if (
            any(n.startswith(DOWNLOADING_DATASET_PACKAGES) for n in names)
            and _is_true(argument_of(call, "download", None))
            and not _per_rank(facts, argument_of(call, "root", 0))
        ):
            return "torchvision"
        method = facts.method_name(call)
        if (
            method in {"map", "filter"}
            and isinstance(call.func, cst.Attribute)
            and not _is_true(argument_of(call, "keep_in_memory", None))
            # `load_from_cache_file=False`: every rank computes its own copy whatever the order (accelerate's test
            # scripts): going first would change nothing
            and not _is_false(argument_of(call, "load_from_cache_file", None))
            and self._loaded_dataset(call.func.value, call, 0)
        ):
            return "map"
        return None

    def _is_load_dataset(self, call: cst.Call) -> bool:
        """``datasets.load_dataset`` called by its name, an import alias, or a variable or parameter bound to it
        (``loading_method = load_dataset``, ``= load_from_disk if cached else load_dataset``)."""
        facts = self.facts
        if facts.callee_is(call, LOAD_DATASET):
            return True
        func = call.func
        if not isinstance(func, cst.Name) or func.value in facts.imported_names:
            return False
        if not facts.bindings(func.value, call) and facts.parameter(func.value, call) is None:
            return False
        return any(
            o.node is not func
            and isinstance(o.node, (cst.Name, cst.Attribute))
            and not LOAD_DATASET.isdisjoint(facts.qualified_names(o.node))
            for o in facts.origins(func, call)
        )

    def _local_files(self, call: cst.Call) -> bool:
        """``load_dataset("json", data_files=...)``/``data_dir=`` or a local path, with no remote URL in sight
        (a literal, an f-string, or a name bound to one, alone or inside a list, tuple or dict)."""
        if any(self._remote(arg.value, call, 0) for arg in call.args):
            return False
        if argument_of(call, "data_files", 3) is not None or argument_of(call, "data_dir", 2) is not None:
            return True
        path = argument_of(call, "path", 0)
        return _literal_startswith(path, ("./", "../", "/", "~"))

    def _remote(self, expr: cst.BaseExpression | None, at: cst.CSTNode, depth: int) -> bool:
        """``expr`` is (or holds) a URL: ``"hf://..."``, ``f"https://.../{name}"``, or a name bound to one."""
        if expr is None or depth > MAX_DEPTH:
            return False
        if isinstance(expr, (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString)):
            return _string_prefix(expr).startswith(REMOTE_PREFIXES)
        if isinstance(expr, (cst.List, cst.Tuple, cst.Set)):
            return any(self._remote(e.value, at, depth + 1) for e in expr.elements)
        if isinstance(expr, cst.Dict):
            return any(isinstance(e, cst.DictElement) and self._remote(e.value, at, depth + 1) for e in expr.elements)
        if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Add):
            return self._remote(expr.left, at, depth + 1)
        if isinstance(expr, cst.IfExp):
            return self._remote(expr.body, at, depth + 1) or self._remote(expr.orelse, at, depth + 1)
        if isinstance(expr, cst.Name):
            return any(
                o.node is not expr and self._remote(o.node, o.node, depth + 1)
                for o in self.facts.origins(expr, at)
                if isinstance(o.node, cst.BaseExpression)
            )
        return False

    def _loaded_dataset(self, expr: cst.BaseExpression, at: cst.CSTNode, depth: int) -> bool:
        """``expr`` is a dataset read through ``load_dataset`` (not streamed), or derived from one."""
        if depth > MAX_DEPTH:
            return False
        # a subscript or a method chain descends into a smaller expression and cannot cycle: only following a
        # name's origins spends depth (`splits["train"].filter(...)` of `splits = raw.map(...).with_format(...)`)
        if isinstance(expr, cst.Subscript):
            return self._loaded_dataset(expr.value, at, depth)
        if isinstance(expr, cst.Call):
            if self._is_load_dataset(expr):
                return not _is_true(argument_of(expr, "streaming", None))
            if isinstance(expr.func, cst.Attribute) and expr.func.attr.value in DATASET_METHODS:
                return self._loaded_dataset(expr.func.value, expr, depth)
        if isinstance(expr, (cst.Name, cst.Attribute, cst.Call)):
            return any(
                o.node is not expr and self._loaded_dataset(o.node, o.node, depth + 1)
                for o in self.facts.origins(expr, at)
                if isinstance(o.node, cst.BaseExpression)
            )
        return False

    # -- what already orders it -------------------------------------------------------------

    def _ordered(self, node: cst.CSTNode, depth: int) -> bool:
        """``node`` runs inside a main-process-first block, on one side of a rank test, between the barriers of
        the rank-0-first idiom, next to a collective, or in a helper only called from such places."""
        facts = self.facts
        child = node
        for ancestor in facts.ancestors(node):
            if isinstance(ancestor, cst.With) and any(self._goes_first(item.item) for item in ancestor.items):
                return True
            if isinstance(ancestor, cst.If) and child is not ancestor.test and facts.rank_dependent(ancestor.test):
                return True
            # `for url in urls[rank::world_size]:` each rank has its own items, and its own number of iterations
            if isinstance(ancestor, cst.For) and child is ancestor.body and _per_rank(facts, ancestor.iter):
                return True
            if isinstance(ancestor, (cst.IndentedBlock, cst.Module)) and self._after_rank_barrier(ancestor, child):
                return True
            # the statement of the flagged call itself: wrapping a collective would deadlock
            if (
                depth == 0
                and isinstance(ancestor, cst.SimpleStatementLine)
                and any(facts.method_name(call) in SYNCHRONIZING for call in facts.reachable_calls(ancestor))
            ):
                return True
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                break
            child = ancestor
        if facts.rank_guard(node) is not None:
            return True
        function = facts.enclosing_function(node)
        if function is None or depth >= MAX_CALLER_DEPTH:
            return False
        sites = facts.call_sites(function)
        # callers in the project's other modules: one under a rank test there (open_clip builds its audio
        # zero-shot set under `if is_master(args):` in main.py) is ordered already
        elsewhere = facts.external_call_sites(function)
        if not sites and not elsewhere:
            return False
        return all(self._ordered(site, depth + 1) for site in sites) and all(
            site.facts.all_ranks_reach(site.call).value is False for site in elsewhere
        )

    def _goes_first(self, context: cst.BaseExpression) -> bool:
        """``accelerator.main_process_first()``, ``training_args.main_process_first(desc=...)``,
        ``torch_distributed_zero_first(rank)``, or a name bound to one of them."""
        target = context.func if isinstance(context, cst.Call) else context
        candidates = [target] + [o.node for o in self.facts.origins(target) if isinstance(o.node, cst.BaseExpression)]
        for candidate in candidates:
            if isinstance(candidate, cst.IfExp):
                candidates.extend((candidate.body, candidate.orelse))
                continue
            name = get_full_name_for_node(candidate) or ""
            if "first" in name.rsplit(".", 1)[-1]:
                return True
        # a context manager of this file that waits at a barrier (`rank0_then_others(rank)`)
        return isinstance(context, cst.Call) and any(
            self.facts.method_name(call) in BARRIER_METHODS
            for function in self.facts.local_functions(context)
            for call in self.facts.reachable_calls(function)
        )

    def _after_rank_barrier(self, block: cst.IndentedBlock | cst.Module, child: cst.CSTNode) -> bool:
        """An earlier ``if rank != 0: dist.barrier()`` in the same block opens the rank-0-first idiom."""
        facts = self.facts
        for statement in block.body:
            if statement is child:
                return False
            if (
                isinstance(statement, cst.If)
                and facts.excludes_main(statement.test, True)
                and any(facts.method_name(call) in BARRIER_METHODS for call in facts.calls_within(statement.body))
            ):
                return True
        return False

    # -- the report and its fix ---------------------------------------------------------------

    def _report(self, group: list[_Item], run: list[cst.SimpleStatementLine] | None, framework: str) -> None:
        first = group[0]
        inside = first.constructed is not None and len(group) == 1
        if inside:
            # order the download and the map inside the constructor, not the whole construction (which may also
            # decode every example into memory, on the main process while the others wait, then on each of them);
            # a construction in a run with other reported calls is wrapped with them, by one block
            statement = self._statement(first.inner[0])
            flagged = {id(s) for s in (self._statement(c) for c in first.inner) if s is not None}
            run = self._run(statement, flagged) if statement is not None else None
            plan = self._plan(first.inner[0], run, framework)
        else:
            plan = self._plan(first.anchor, run, framework)
        lines = [self.context.span(item.anchor).line for item in group[1:]]
        if first.constructed is not None:
            cls = get_full_name_for_node(first.anchor.func) or "the class"
            inner = first.inner[0]
            what = (
                f"`{cls}(...)` runs `{_callee(inner)}()` in its constructor (line "
                f"{self.context.span(inner).line}), which {KINDS[first.what][0]}"
            )
        else:
            what = f"`{_callee(first.anchor)}()` {KINDS[first.what][0]}"
        _, cost, ordered = KINDS[first.what]
        if lines:
            more = ", ".join(str(line) for line in lines)
            count = (
                f"1 more call in the statements that follow (line {more})"
                if len(lines) == 1
                else f"{len(lines)} more calls in the statements that follow (lines {more})"
            )
            verb = "does" if len(lines) == 1 else "do"
            what += f" on every rank at once, and so {verb} {count}"
        else:
            what += " on every rank at once"
        if plan.context is None:
            advice = plan.advice
        elif inside:
            advice = f"wrap that call in the constructor in `with {plan.display}:`"
        elif lines and run:
            advice = f"wrap these statements in one `with {plan.display}:` block"
        else:
            advice = f"wrap it in `with {plan.display}:`"
        fix, why_not = None, ""
        if plan.context is not None and run and id(run[0]) not in self._fixed:
            reach = self.facts.all_ranks_reach(run[0])
            if reach.value is True:
                fix = self._fix(run, plan)
                self._fixed.add(id(run[0]))  # each construction is reported; the constructor is fixed once
            else:
                why_not = f" (no automatic fix: {barrier_unsafe(reach)})"
        message = f"{what}: {cost}; {advice} so {ordered}{why_not}"
        severity = Severity.INFO if all(item.what == "remote_cache" for item in group) else None
        self.report(first.anchor, message, severity=severity, fix=fix)

    def _plan(self, anchor: cst.Call, run: list[cst.SimpleStatementLine] | None, framework: str) -> _Plan:
        """Which block orders the run, how safe that is, or why there is no fix (in the advice)."""
        statement = self._statement(anchor)
        runtime = "lintdist.runtime.main_process_first()"
        if statement is None:
            statement = next(a for a in self.facts.ancestors(anchor) if isinstance(a, cst.BaseStatement))
        elif run is not None and self._called_from_ordered_code(statement):
            # an ordered block here would wait at a barrier the other ranks never reach from the guarded caller
            return _Plan(
                None,
                "order it at its callers instead (a main-process-only caller reaches it too, where a barrier "
                "inside would hang)",
            )
        free = self.context.runtime_name_free("main_process_first")
        if framework == "torch":
            if free and not self._group_started_later(statement):
                return _Plan("main_process_first()", "", runtime, RUNTIME_IMPORT)
            return _Plan(
                None,
                "wrap it in `with lintdist.runtime.main_process_first():` (or the rank-0-first `dist.barrier()` pair)",
            )
        found = self._accelerator_at(statement)
        if found is not None:
            key, maybe_none = found
            if not maybe_none:
                context = f"{key}.main_process_first()"
                return _Plan(context, "", context)
            # `accelerator = Accelerator() if ... else None`: the runtime helper orders through the accelerator
            # when there is one, through torch.distributed otherwise, and just runs the block without a group
            if free:
                context = f"main_process_first(accelerator={key})"
                return _Plan(context, "", f"lintdist.runtime.{context}", RUNTIME_IMPORT)
            return _Plan(None, f"wrap it in `with lintdist.runtime.main_process_first(accelerator={key}):`")
        before = self._group_before(statement, 0)
        if before is False or (before is None and self._group_started_later(statement)):
            if self._state_can_start_here(statement):
                context = "PartialState().main_process_first()"
                return _Plan(context, "", context, STATE_IMPORT, Applicability.UNSAFE)
            return _Plan(None, "create the accelerator first and wrap it in `with accelerator.main_process_first():`")
        if not free:
            return _Plan(None, f"wrap it in `with {runtime}:`")
        # no accelerator in reach, but the process group exists by then (True), or the callers are not in this
        # file (None): they might call it from a main-process-only branch, where the block's barrier would hang
        applicability = Applicability.SAFE if before else Applicability.UNSAFE
        return _Plan("main_process_first()", "", runtime, RUNTIME_IMPORT, applicability)

    def _called_from_ordered_code(self, statement: cst.SimpleStatementLine) -> bool:
        """The statement's function is also called from a main-process branch or an ordered block."""
        function = self.facts.enclosing_function(statement)
        if function is None:
            return False
        return any(self._ordered(site, 1) for site in self.facts.call_sites(function))

    def _constructions(self, call: cst.Call) -> list[cst.Call]:
        """The unordered constructions ``Cls(...)`` of a class whose ``__init__`` (or a method only it calls)
        holds ``call``, when no accelerator is in reach there; empty when none is found (report in place)."""
        facts = self.facts
        function = facts.enclosing_function(call)
        cls = facts.enclosing_class(function) if function is not None else None
        if cls is None:
            return []
        statement = self._statement(call)
        if statement is not None and self._accelerator_at(statement) is not None:
            return []
        seen = {id(function)}
        pending = [function]
        found: list[cst.Call] = []
        while pending:
            current = pending.pop()
            if facts.enclosing_class(current) is not cls or facts.enclosing_function(current) is not None:
                return []
            sites = facts.call_sites(current)
            if current.name.value == "__init__":
                found.extend(site for site in sites if isinstance(site.func, (cst.Name, cst.Attribute)))
                continue
            if not sites:
                return []
            for site in sites:
                caller = facts.enclosing_function(site)
                if caller is None:
                    return []
                if id(caller) not in seen and len(seen) <= MAX_DEPTH:
                    seen.add(id(caller))
                    pending.append(caller)
        return [site for site in found if not self._ordered(site, 0)]

    def _statement(self, call: cst.Call) -> cst.SimpleStatementLine | None:
        """The simple statement line holding the call, if it sits directly in a block (not in a header)."""
        facts = self.facts
        for ancestor in facts.ancestors(call):
            if isinstance(ancestor, cst.SimpleStatementLine):
                return ancestor if isinstance(facts.parent(ancestor), (cst.IndentedBlock, cst.Module)) else None
            if isinstance(ancestor, (cst.BaseCompoundStatement, cst.SimpleStatementSuite, cst.Lambda)):
                return None
        return None

    def _run(self, statement: cst.SimpleStatementLine, flagged: set[int]) -> list[cst.SimpleStatementLine] | None:
        """The consecutive simple statements from the first to the last flagged one around ``statement``."""
        block = self.facts.parent(statement)
        body = list(block.body)
        index = next(i for i, s in enumerate(body) if s is statement)
        if not self._wrappable(statement):
            return None
        start = end = index
        scan = index
        while scan > 0 and isinstance(body[scan - 1], cst.SimpleStatementLine) and self._wrappable(body[scan - 1]):
            scan -= 1
            if id(body[scan]) in flagged:
                start = scan
        scan = index
        while (
            scan + 1 < len(body)
            and isinstance(body[scan + 1], cst.SimpleStatementLine)
            and self._wrappable(body[scan + 1])
        ):
            scan += 1
            if id(body[scan]) in flagged:
                end = scan
        return body[start : end + 1]

    def _wrappable(self, statement: cst.SimpleStatementLine) -> bool:
        """Nothing in it waits for the other ranks, builds the accelerator or starts the process group."""
        facts = self.facts
        for call in facts.reachable_calls(statement):
            if facts.method_name(call) in UNWRAPPABLE or facts.callee_is(
                call, ACCELERATE_SCRIPT | INIT_PROCESS_GROUP | DDP_CLASSES
            ):
                return False
        if any(isinstance(small, (cst.Global, cst.Nonlocal)) for small in statement.body):
            return False
        # a generator would suspend inside the block, holding the other ranks at its barrier
        return not facts.within(statement, cst.Yield, cst.Await)

    def _accelerator_at(self, statement: cst.SimpleStatementLine) -> tuple[str, bool] | None:
        """The script's own expression for its accelerator (or accelerate state) bound before ``statement``, and
        whether it may be None there (``accelerator=None``, ``Accelerator() if cond else None``)."""
        facts = self.facts
        line = self.context.span(statement).line
        function = facts.enclosing_function(statement)
        candidates: list[str] = []
        if function is not None:
            params = [*function.params.posonly_params, *function.params.params, *function.params.kwonly_params]
            candidates.extend(p.name.value for p in params)
        candidates.extend(self._state_targets)
        for key in dict.fromkeys(c for c in candidates if c):
            kinds = self._state_origins(key, statement)
            if "state" not in kinds:
                continue
            maybe_none = "none" in kinds
            bindings = facts.bindings(key, statement)
            parameter = facts.parameter(key, statement) if function is not None else None
            if not bindings and parameter is not None:
                return key, maybe_none or _none(parameter[2].default)
            if any(self._bound_before(b.statement, b.function, function, line) for b in bindings):
                return key, maybe_none
        return None

    @cached_property
    def _state_targets(self) -> list[str]:
        """The names the file binds an Accelerator or accelerate state to (`accelerator = Accelerator(...)`)."""
        facts = self.facts
        found: list[str] = []
        for call in facts.calls:
            if facts.callee_is(call, STATE_CLASSES):
                assign = facts.parent(call)
                while isinstance(assign, cst.IfExp):  # `Accelerator(...) if cond else Accelerator()`
                    assign = facts.parent(assign)
                if isinstance(assign, cst.Assign):
                    found.extend(get_full_name_for_node(t.target) or "" for t in assign.targets)
                elif isinstance(assign, cst.AnnAssign):
                    found.append(get_full_name_for_node(assign.target) or "")
        return found

    def _state_origins(self, key: str, at: cst.CSTNode) -> set[str]:
        """What an accelerator expression can hold: "state" (an Accelerator or PartialState), "none", "other".
        A parameter annotated ``Accelerator`` counts as one; a name a nested function reads from its enclosing
        function is followed there."""
        facts = self.facts
        kinds: set[str] = set()
        parameter = facts.parameter(key, at) if "." not in key else None
        annotation = parameter[2].annotation if parameter is not None else None
        if annotation is not None and not STATE_CLASSES.isdisjoint(facts.qualified_names(annotation.annotation)):
            kinds.add("state")
        pending = [(o, 0) for o in facts.origins(cst.parse_expression(key), at)]
        while pending:
            origin, depth = pending.pop()
            node = origin.node
            if isinstance(node, cst.Call) and facts.callee_is(node, STATE_CLASSES):
                kinds.add("state")
            elif _none(node):
                kinds.add("none")
            elif isinstance(node, cst.Name) and depth < MAX_CALLER_DEPTH:
                # a free variable of a nested function: its binding in the enclosing function
                inner = facts.enclosing_function(node)
                outer = facts.enclosing_function(inner) if inner is not None else None
                found = facts.bindings(node.value, inner) if outer is not None else []
                if not found:
                    kinds.add("other")
                for binding in found:
                    pending.extend((o, depth + 1) for o in facts.origins(binding.value, binding.statement))
            elif isinstance(node, cst.Param):
                kinds.add("none" if _none(node.default) else "other")
            else:
                kinds.add("other")
        return kinds

    def _bound_before(self, bound_at: cst.CSTNode, bound_in, function, line: int) -> bool:
        """A binding is visible at ``line``: earlier in the same function, or in another function or module level
        when ``line`` is inside a function (which runs later)."""
        if bound_in is function:
            return self.context.span(bound_at).line < line
        if function is None:
            return False
        # `data = load()` above `accelerator = Accelerator()`: the function runs before the binding exists
        bound_line = self.context.span(bound_at).line
        return not any(
            self.facts.enclosing_function(site) is bound_in and self.context.span(site).line < bound_line
            for site in self.facts.call_sites(function)
        )

    def _group_started_later(self, statement: cst.SimpleStatementLine) -> bool:
        """The process group is started (``init_process_group``, an ``Accelerator``/``PartialState``) after
        ``statement`` in the same function: ordering would be a no-op."""
        facts = self.facts
        function = facts.enclosing_function(statement)
        line = self.context.span(statement).line
        return any(
            facts.callee_is(call, INIT_PROCESS_GROUP | STATE_CLASSES)
            and facts.enclosing_function(call) is function
            and self.context.span(call).line > line
            for call in facts.calls
        )

    def _state_can_start_here(self, statement: cst.SimpleStatementLine) -> bool:
        """The accelerator (or ``PartialState``) is built later in this function, in a way that a
        ``PartialState()`` started here sets up the same: no ``cpu=`` (accelerate refuses a CPU accelerator on a
        state already on a GPU), no ``kwargs_handlers`` (process-group options), no DeepSpeed plugin (which picks
        the backend through the environment), only keywords that leave the process state alone; and the script
        builds nothing else that starts a group (``init_process_group``, ``deepspeed.initialize``)."""
        facts = self.facts
        if not all(
            isinstance(b.node, cst.ImportFrom)
            and get_full_name_for_node(b.node.module) in {"accelerate", "accelerate.state"}
            for b in self.context.names.module_bindings("PartialState")
        ):
            return False
        function = facts.enclosing_function(statement)
        states = [c for c in facts.calls if facts.callee_is(c, INIT_PROCESS_GROUP | STATE_CLASSES)]
        later = [
            c
            for c in states
            if facts.enclosing_function(c) is function and facts.index.order(c) > facts.index.order(statement)
        ]
        return bool(later) and all(
            facts.callee_is(c, STATE_CLASSES)
            and all(arg.keyword is not None and arg.keyword.value in STATE_NEUTRAL_KEYWORDS for arg in c.args)
            for c in states
        )

    def _group_before(self, node: cst.CSTNode, depth: int) -> bool | None:
        """An ``Accelerator``/``PartialState`` or ``init_process_group`` runs before ``node``: earlier in its
        function (directly or in a local helper it calls), or before every call site of that function. None when
        the function has no call site in this file (its callers are unknown)."""
        facts = self.facts
        function = facts.enclosing_function(node)
        order = facts.index.order(node)
        scope = function if function is not None else facts.index.module
        for call in facts.within(scope, cst.Call):
            if facts.index.order(call) >= order or facts.enclosing_function(call) is not function:
                continue
            if facts.callee_is(call, INIT_PROCESS_GROUP | STATE_CLASSES) or any(
                facts.callee_is(c, INIT_PROCESS_GROUP | STATE_CLASSES)
                for helper in facts.local_functions(call)
                for c in facts.reachable_calls(helper)
            ):
                return True
        if function is None:
            return False
        sites = facts.call_sites(function)
        if not sites or depth >= MAX_CALLER_DEPTH:
            return None
        answers = [self._group_before(site, depth + 1) for site in sites]
        if all(answers):
            return True
        return False if False in answers else None

    def _fix(self, run: list[cst.SimpleStatementLine], plan: _Plan) -> Fix:
        first = run[0]
        block = cst.With(
            items=[cst.WithItem(cst.parse_expression(plan.context))],
            body=cst.IndentedBlock(body=[first.with_changes(leading_lines=()), *run[1:]]),
            leading_lines=first.leading_lines,
        )
        return Fix(
            plan.applicability,
            f"Wrap the dataset preparation in `with {plan.display}:`",
            replacements=((first, block), *((s, cst.RemovalSentinel.REMOVE) for s in run[1:])),
            imports=(plan.runtime_import,) if plan.runtime_import else (),
        )


@dataclass
class _Item:
    """A report's anchor: the call, or the construction of a class whose constructor downloads."""

    anchor: cst.Call
    what: str
    inner: list[cst.Call]
    constructed: cst.Call | None  # the call inside the constructor, when ``anchor`` is a construction


@dataclass(frozen=True)
class _Plan:
    context: str | None  # the `with` item the fix writes, None for no fix
    advice: str  # the message's advice when there is no fix
    display: str = ""  # the `with` item as the message names it
    runtime_import: tuple[str, str] | None = None
    applicability: Applicability = Applicability.SAFE


def _callee(call: cst.Call) -> str:
    """``load_dataset``, ``raw.map``; ``.map`` when the receiver is not a dotted name (``ds["train"].map``)."""
    func = call.func
    part = func
    while isinstance(part, cst.Attribute):
        part = part.value
    if isinstance(part, cst.Name):
        return get_full_name_for_node(func) or "this call"
    return f".{func.attr.value}" if isinstance(func, cst.Attribute) else "this call"


def _none(node: cst.CSTNode | None) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"


def _is_true(value: cst.BaseExpression | None) -> bool:
    return isinstance(value, cst.Name) and value.value == "True"


def _is_false(value: cst.BaseExpression | None) -> bool:
    return isinstance(value, cst.Name) and value.value == "False"


def _per_rank(facts, expr: cst.BaseExpression | None) -> bool:
    """Names the rank (``f"./data{local_rank}"``, ``urls[dist.get_rank()::n]``): each rank has its own copy, no race."""
    if expr is None:
        return False
    return any(
        (get_full_name_for_node(name) or "").rsplit(".", 1)[-1] in RANK_NAMES | RANK_GETTERS
        for name in facts.within(expr, cst.Name, cst.Attribute)
    )


def _literal_startswith(expr: cst.BaseExpression | None, prefixes: tuple[str, ...]) -> bool:
    """A string literal (or one inside a list, tuple or dict) that starts with one of ``prefixes``."""
    if isinstance(expr, cst.SimpleString):
        value = expr.evaluated_value
        return isinstance(value, str) and value.startswith(prefixes)
    if isinstance(expr, (cst.List, cst.Tuple, cst.Set)):
        return any(_literal_startswith(e.value, prefixes) for e in expr.elements)
    if isinstance(expr, cst.Dict):
        return any(isinstance(e, cst.DictElement) and _literal_startswith(e.value, prefixes) for e in expr.elements)
    return False


def _string_prefix(expr: cst.BaseExpression) -> str:
    """The literal text a string starts with: all of a plain string, the text before an f-string's first
    ``{...}``, the first part of implicitly concatenated strings."""
    if isinstance(expr, cst.ConcatenatedString):
        return _string_prefix(expr.left)
    if isinstance(expr, cst.SimpleString):
        value = expr.evaluated_value
        return value if isinstance(value, str) else ""
    if isinstance(expr, cst.FormattedString) and expr.parts and isinstance(expr.parts[0], cst.FormattedStringText):
        return expr.parts[0].value
    return ""
