"""LD401 prep-outside-main-process-first: every rank downloads or preprocesses the same dataset at once."""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.blocks import constructions_running, simple_statement, statement_run, with_block
from lintdist.datasets import shared_preparation
from lintdist.facts import DDP_CLASSES, barrier_unsafe
from lintdist.model import Applicability, Fix, Severity
from lintdist.ordering import runs_ordered
from lintdist.process_group import (
    ACCELERATE_SCRIPT,
    INIT_PROCESS_GROUP,
    callers_framework,
    group_started_after,
    group_started_before,
    script_framework,
    state_can_start_at,
    state_expression_at,
)
from lintdist.rule import Invalid, Pattern, Rule, Valid

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
GROUP_OR_WRAPPER = ACCELERATE_SCRIPT | INIT_PROCESS_GROUP | DDP_CLASSES
RUNTIME_IMPORT = ("lintdist.runtime", "main_process_first")
STATE_IMPORT = ("accelerate", "PartialState")
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
    needs_several_processes = True
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
        facts = self.facts
        self._fixed: set[int] = set()
        framework = script_framework(facts)
        if framework is None and facts.project is None:
            return
        flagged = [(call, what) for call in facts.calls if (what := shared_preparation(facts, call)) is not None]
        # a helper module: distributed when the script that calls it is (the loader in `data.py`)
        framework = framework or callers_framework(facts, [call for call, _ in flagged])
        if framework is None:
            return
        flagged = [(call, what) for call, what in flagged if not self._ordered(call)]
        # `ds.filter(...).map(...)` is one chain: report its innermost step only.
        inner = {id(call) for call, _ in flagged}
        flagged = [
            (call, what)
            for call, what in flagged
            if not (
                isinstance(call.func, cst.Attribute)
                and any(id(n) in inner for n in facts.within(call.func.value, cst.Call))
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
        statements = {id(s) for s in (simple_statement(facts, i.anchor) for i in items.values()) if s is not None}
        # One report per run of consecutive statements, fixed by one block.
        groups: dict[int, list[_Item]] = {}
        runs: dict[int, list[cst.SimpleStatementLine] | None] = {}
        for item in sorted(items.values(), key=lambda i: facts.index.order(i.anchor)):
            run = self._run(item.anchor, statements)
            key = id(run[0]) if run else id(item.anchor)
            groups.setdefault(key, []).append(item)
            runs[key] = run
        for key, group in groups.items():
            self._report(group, runs[key], framework)

    def _ordered(self, node: cst.CSTNode) -> bool:
        """Ordered already, or its own statement waits for the other ranks (wrapping it would deadlock)."""
        facts = self.facts
        boundaries = (cst.SimpleStatementLine, cst.FunctionDef, cst.Lambda, cst.ClassDef)
        statement = next((a for a in facts.ancestors(node) if isinstance(a, boundaries)), None)
        if isinstance(statement, cst.SimpleStatementLine) and any(
            facts.method_name(call) in SYNCHRONIZING for call in facts.reachable_calls(statement)
        ):
            return True
        return runs_ordered(facts, node)

    def _constructions(self, call: cst.Call) -> list[cst.Call]:
        """The unordered constructions of a class whose constructor runs ``call``, when no accelerator is in reach
        there; empty when none is found (report in place)."""
        sites = constructions_running(self.facts, call)
        statement = simple_statement(self.facts, call)
        if not sites or (statement is not None and state_expression_at(self.facts, statement) is not None):
            return []
        return [site for site in sites if not self._ordered(site)]

    def _run(self, node: cst.CSTNode, marked: set[int]) -> list[cst.SimpleStatementLine] | None:
        statement = simple_statement(self.facts, node)
        return statement_run(self.facts, statement, marked, self._wrappable) if statement is not None else None

    def _wrappable(self, statement: cst.SimpleStatementLine) -> bool:
        """Nothing in it waits for the other ranks, builds the accelerator or starts the process group."""
        facts = self.facts
        if any(
            facts.method_name(call) in UNWRAPPABLE or facts.callee_is(call, GROUP_OR_WRAPPER)
            for call in facts.reachable_calls(statement)
        ) or any(isinstance(small, (cst.Global, cst.Nonlocal)) for small in statement.body):
            return False
        # a generator would suspend inside the block, holding the other ranks at its barrier
        return not facts.within(statement, cst.Yield, cst.Await)

    # -- the report and its fix ---------------------------------------------------------------

    def _report(self, group: list[_Item], run: list[cst.SimpleStatementLine] | None, framework: str) -> None:
        first = group[0]
        inside = first.constructed is not None and len(group) == 1
        if inside:
            # order the download and the map inside the constructor, not the whole construction (which may also
            # decode every example into memory, on the main process while the others wait, then on each of them);
            # a construction in a run with other reported calls is wrapped with them, by one block
            marked = {id(s) for s in (simple_statement(self.facts, c) for c in first.inner) if s is not None}
            run = self._run(first.inner[0], marked)
        plan = self._plan(first.inner[0] if inside else first.anchor, run, framework)
        lines = [self.context.span(item.anchor).line for item in group[1:]]
        doing, cost, ordered = KINDS[first.what]
        if first.constructed is not None:
            cls = get_full_name_for_node(first.anchor.func) or "the class"
            inner = first.inner[0]
            line = self.context.span(inner).line
            what = f"`{cls}(...)` runs `{_callee(inner)}()` in its constructor (line {line}), which {doing}"
        else:
            what = f"`{_callee(first.anchor)}()` {doing}"
        what += " on every rank at once"
        if lines:
            more = ", ".join(str(line) for line in lines)
            count = f"1 more call in the statements that follow (line {more})"
            if len(lines) > 1:
                count = f"{len(lines)} more calls in the statements that follow (lines {more})"
            what += f", and so {'does' if len(lines) == 1 else 'do'} {count}"
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
                fix = Fix(
                    plan.applicability,
                    f"Wrap the dataset preparation in `with {plan.display}:`",
                    replacements=with_block(run, plan.context),
                    imports=(plan.runtime_import,) if plan.runtime_import else (),
                )
                self._fixed.add(id(run[0]))  # each construction is reported; the constructor is fixed once
            else:
                why_not = f" (no automatic fix: {barrier_unsafe(reach)})"
        message = f"{what}: {cost}; {advice} so {ordered}{why_not}"
        severity = Severity.INFO if all(item.what == "remote_cache" for item in group) else None
        self.report(first.anchor, message, severity=severity, fix=fix)

    def _plan(self, anchor: cst.Call, run: list[cst.SimpleStatementLine] | None, framework: str) -> _Plan:
        """Which block orders the run, how safe that is, or why there is no fix (in the advice)."""
        facts = self.facts
        statement = simple_statement(facts, anchor)
        runtime = "lintdist.runtime.main_process_first()"
        if statement is None:
            statement = next(a for a in facts.ancestors(anchor) if isinstance(a, cst.BaseStatement))
        elif run is not None and any(runs_ordered(facts, site, 1) for site in self._call_sites(statement)):
            # an ordered block here would wait at a barrier the other ranks never reach from the guarded caller
            return _Plan(
                None,
                "order it at its callers instead (a main-process-only caller reaches it too, where a barrier "
                "inside would hang)",
            )
        free = self.context.runtime_name_free("main_process_first")
        if framework == "torch":
            if free and not group_started_after(facts, statement):
                return _Plan("main_process_first()", "", runtime, RUNTIME_IMPORT)
            return _Plan(
                None,
                "wrap it in `with lintdist.runtime.main_process_first():` (or the rank-0-first `dist.barrier()` pair)",
            )
        found = state_expression_at(facts, statement)
        if found is not None:
            key, maybe_none = found
            if not maybe_none:
                context = f"{key}.main_process_first()"
                return _Plan(context, "", context)
            # `accelerator = Accelerator() if ... else None`: the runtime helper orders through the accelerator
            # when there is one, through torch.distributed otherwise, and just runs the block without a group
            context = f"main_process_first(accelerator={key})"
            if free:
                return _Plan(context, "", f"lintdist.runtime.{context}", RUNTIME_IMPORT)
            return _Plan(None, f"wrap it in `with lintdist.runtime.{context}:`")
        before = group_started_before(facts, statement)
        if before is False or (before is None and group_started_after(facts, statement)):
            if state_can_start_at(facts, statement):
                context = "PartialState().main_process_first()"
                return _Plan(context, "", context, STATE_IMPORT, Applicability.UNSAFE)
            return _Plan(None, "create the accelerator first and wrap it in `with accelerator.main_process_first():`")
        if not free:
            return _Plan(None, f"wrap it in `with {runtime}:`")
        # no accelerator in reach, but the process group exists by then (True), or the callers are not in this
        # file (None): they might call it from a main-process-only branch, where the block's barrier would hang
        applicability = Applicability.SAFE if before else Applicability.UNSAFE
        return _Plan("main_process_first()", "", runtime, RUNTIME_IMPORT, applicability)

    def _call_sites(self, node: cst.CSTNode) -> list[cst.Call]:
        function = self.facts.enclosing_function(node)
        return self.facts.call_sites(function) if function is not None else []


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
