"""LD403 read-after-write-without-barrier: a file written on the main process and read by every rank with no
barrier in between, so the other ranks read a missing or stale file."""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import MAIN_FLAGS, MAIN_ONLY_DECORATORS, RANK_GETTERS, RANK_NAMES, argument_of, barrier_unsafe
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Rule, Valid, words

# Functions that write a file, with the parameter that names it (keyword, position).
WRITE_FUNCTIONS = {
    "torch.save": ("f", 1),
    "torch.serialization.save": ("f", 1),
    "safetensors.torch.save_file": ("filename", 1),
}
READ_FUNCTIONS = {
    "torch.load": ("f", 0),
    "torch.serialization.load": ("f", 0),
    "safetensors.torch.load_file": ("filename", 0),
}
# Accelerator methods that write on the main process only (`accelerate.utils.other.save` checks
# `PartialState().is_main_process`); `save_state` writes the model, optimizer and scheduler files through it.
MAIN_ONLY_WRITES = {"save": ("f", 1), "save_model": ("save_directory", 1), "save_state": ("output_dir", 0)}
ACCELERATOR_READS = {"load_state": ("input_dir", 0)}
# Calls no rank leaves before every rank has reached them: barriers by any receiver, and collectives of Python
# objects (they pickle on the host and wait for the data; a tensor collective under NCCL returns at once).
SYNCHRONISING = frozenset(
    {"barrier", "monitored_barrier", "wait_for_everyone", "rendezvous"}
    | {"all_gather_object", "gather_object", "broadcast_object_list", "scatter_object_list"}
)
# The text one of which a module holds if a function of it can reach a barrier.
BARRIER_MARKERS = tuple(sorted(SYNCHRONISING))
# Helpers named for a barrier (detectron2's `comm.synchronize()`, `utils.barrier_all()`), trusted where their body
# is out of sight; a device's `synchronize` waits for its own kernels only.
SYNCHRONISE_NAMES = frozenset({"synchronize", "sync_processes", "barrier_all", "wait_all_ranks"})
DEVICE_SYNCHRONISE = frozenset({f"torch.{device}.synchronize" for device in ("cuda", "xpu", "mps", "npu", "mlu")})
WRITE_OR_READ_NAMES = frozenset({"save", "load", "save_pretrained", "from_pretrained", "save_state", "load_state"})
# A temporary folder is each process's own: a write there never reaches another rank (a single-process test).
TEMPORARY = frozenset(
    {"tempfile.TemporaryDirectory", "tempfile.mkdtemp", "tempfile.NamedTemporaryFile", "tempfile.mkstemp"}
)
# accelerate's placeholders for an optimizer and scheduler that a DeepSpeed config defines: the script runs
# under DeepSpeed, whose `save_checkpoint` (called by `save_state`) ends with a barrier.
DEEPSPEED_PLACEHOLDERS = frozenset(
    f"accelerate.utils{module}.{name}" for module in ("", ".deepspeed") for name in ("DummyOptim", "DummyScheduler")
)
# How far the write or the read is followed out through the callers of its function.
MAX_LIFT = 3


class ReadAfterWriteWithoutBarrier(Rule):
    """
    ## What it does
    Reports a read of a file (`torch.load`, `from_pretrained`,
    `accelerator.load_state`, safetensors' `load_file`) by every rank after
    the same path was written on the main process only, with no
    `accelerator.wait_for_everyone()` or `torch.distributed.barrier()` in
    between. A write is on the main process only when it sits under a rank
    guard (`if accelerator.is_main_process:`, `if rank == 0:`, in the
    function or at a call of the function), or when the API writes there
    itself: `accelerator.save`, `accelerator.save_model`,
    `accelerator.save_state` and `save_pretrained(...,
    is_main_process=...)`. Paths match by value: the same variable (its
    assignments followed), the same string, the same `os.path.join(...)`
    expression or the same attribute (`args.output_dir`). A write or read
    inside a helper of the same file (a trainer's `save()` method) is followed
    to its call. Anything that waits for every rank counts as a barrier
    between the two: `wait_for_everyone()`, a `barrier()` of any object
    (`fabric.barrier()`), a collective of Python objects
    (`broadcast_object_list`, `gather_object`), a function of this file or of
    another module of the project that calls one, and a helper named
    `synchronize()` whose body lintdist cannot read (not
    `torch.cuda.synchronize()`, which waits for the device only).

    ## Why is this bad?
    Nothing makes the other ranks wait for the main process to finish
    writing: they reach the read while rank 0 is still saving, and fail with
    `FileNotFoundError` or, worse, load the file of a previous run or a
    half-written one. The race depends on timing, so it passes on a small
    model and breaks on a large one or a slow filesystem. A read of a
    checkpoint that this run never writes (a resume path, a pretrained
    model) needs no barrier and is not reported, nor is a read on the main
    process only, nor a path in a temporary folder of the process's own
    (`with tempfile.TemporaryDirectory() as d`: no other rank sees it).
    `accelerator.save_state` then `load_state` is reported except under
    DeepSpeed (the launch selects it, or the script uses accelerate's
    `DummyOptim`/`DummyScheduler`), where the engine's `save_checkpoint`
    ends with a barrier; under DDP and FSDP `save_state` writes the model
    and optimizer files through `accelerate.utils.save` on the main process
    and returns with no barrier, and `load_state` starts with none.

    ## Example
    ```python
    if accelerator.is_main_process:
        torch.save(model.state_dict(), "best.pt")
    model.load_state_dict(torch.load("best.pt"))
    ```

    ## Use instead
    ```python
    if accelerator.is_main_process:
        torch.save(model.state_dict(), "best.pt")
    accelerator.wait_for_everyone()
    model.load_state_dict(torch.load("best.pt"))
    ```

    ## Fix safety
    The fix inserts the barrier before the statement that reads, in the
    function where the write and the read meet: `<accelerator>.wait_for_everyone()`
    when an Accelerator is in sight there, `PartialState().wait_for_everyone()`
    in another accelerate script (it does nothing in a single process), else
    `torch.distributed.barrier()` spelled as the script imports
    `torch.distributed`. It is safe: the barrier only makes the ranks wait. It
    is offered only where every rank provably reaches that statement
    (a barrier under a rank guard would hang); otherwise the message says why.

    ## References
    - accelerate `Accelerator.save` and `accelerate.utils.save`: write on the
      main process only; `save_state` writes its model and optimizer files
      through it and ends with no barrier, and `load_state` starts with none
    - allenai/OLMo pull request #234: the initial checkpoint read before the
      writer finished, `FileNotFoundError`; fixed by a barrier before the load
    - KempnerInstitute/KempnerForge issue #49: non-zero ranks return from
      `save()` before rank 0 commits `train_state.pt` and race the post-save
      readers (flaky on NFS and Lustre); fixed by a `dist.barrier()`
    - pytorch/pytorch pull request #84881: the same race the other way round
      (rank 0 deletes the checkpoint before the other ranks load it)
    """

    code = "LD403"
    name = "read-after-write-without-barrier"
    severity = Severity.ERROR
    needs_several_processes = True
    fix_kind = "safe"
    # a read call, a write call, and something that writes on the main process only (a rank guard, a main-process
    # flag, or accelerate's own main-only writes: `accelerator.save`, `accelerator.save_state`...)
    triggers = ("torch.load(", "from_pretrained(", "load_state(", "load_file(")
    also_triggers = (
        ("save(", "save_pretrained(", "save_model(", "save_state(", "save_file("),
        (words(*RANK_NAMES, *RANK_GETTERS, *MAIN_FLAGS, *MAIN_ONLY_DECORATORS), "accelerator.save"),
    )

    VALID = (
        Valid(
            """\
import torch
from accelerate import Accelerator

accelerator = Accelerator()
if accelerator.is_main_process:
    torch.save(model.state_dict(), "best.pt")
accelerator.wait_for_everyone()
model.load_state_dict(torch.load("best.pt"))
"""
        ),
        Valid(
            """\
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
model.load_state_dict(torch.load(args.resume))  # a checkpoint of an earlier run
train(model)
if dist.get_rank() == 0:
    torch.save(model.state_dict(), args.output)
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
import torch
from accelerate import Accelerator

accelerator = Accelerator()
if accelerator.is_main_process:
    torch.save(model.state_dict(), "best.pt")
model.load_state_dict(torch.load("best.pt"))
""",
            lines=(7,),
            fixed="""\
import torch
from accelerate import Accelerator

accelerator = Accelerator()
if accelerator.is_main_process:
    torch.save(model.state_dict(), "best.pt")
accelerator.wait_for_everyone()
model.load_state_dict(torch.load("best.pt"))
""",
        ),
        Invalid(
            """\
import os

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
path = os.path.join(args.output_dir, "model.pt")
if dist.get_rank() == 0:
    torch.save(model.state_dict(), path)
state = torch.load(path, map_location="cpu")
""",
            lines=(10,),
            fixed="""\
import os

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
path = os.path.join(args.output_dir, "model.pt")
if dist.get_rank() == 0:
    torch.save(model.state_dict(), path)
dist.barrier()
state = torch.load(path, map_location="cpu")
""",
        ),
    )

    def finish(self) -> None:
        facts = self.facts
        # names first (cheap), resolution only in a file that has both a write and a read by name
        named = [(call, facts.method_name(call)) for call in facts.calls]
        write_names = {"save_pretrained", "save", "save_file", *MAIN_ONLY_WRITES}
        read_names = {"from_pretrained", "load", "load_file", *ACCELERATOR_READS}
        if not any(name in write_names for _, name in named) or not any(name in read_names for _, name in named):
            return
        writes = []
        reads = []
        for call, name in named:
            if name in write_names:
                write = self._write(call, name)
                if write is not None:
                    writes.append((call, write[0], write[1]))
                    continue
            if name in read_names:
                read = self._read(call, name)
                if read is not None:
                    reads.append((call, read))
        if not writes or not reads:
            return
        reported: set[int] = set()
        # the values a path can have first; whether it lies in a temporary folder only for a pair that matches
        keys = {id(write_call): self._values(write_path, write_call) for write_call, write_path, _ in writes}
        written = set().union(*keys.values())
        if not written:
            return
        for read_call, read_paths in reads:
            values = [(path, self._values(path, read_call)) for path in read_paths]
            if not any(found & written for _, found in values):
                continue
            read_keys = {key for path, found in values if not self._temporary(path, read_call) for key in found}
            read_anchors = self._anchors(read_call, reading=True) if read_keys else []
            if not read_anchors:
                continue
            for write_call, write_path, main_only in writes:
                if not read_keys & keys[id(write_call)] or self._temporary(write_path, write_call):
                    continue
                if facts.method_name(write_call) == "save_state" and self._deepspeed():
                    continue  # DeepSpeed's `save_checkpoint` ends with a barrier
                found = self._unordered(write_call, main_only, read_anchors)
                if found is None or id(read_call) in reported:
                    continue
                reported.add(id(read_call))
                self._report(read_call, write_call, found)

    # -- writes and reads -------------------------------------------------------------------

    def _write(self, call: cst.Call, name: str) -> tuple[cst.BaseExpression, bool] | None:
        """(the path written, whether the API itself writes on the main process only), or None."""
        facts = self.facts
        if name == "save_pretrained":
            path = _argument(call, "save_directory", 0)
            flag = _keyword(call, "is_main_process")
            main_only = flag is not None and not (isinstance(flag, cst.Name) and flag.value == "True")
            return (path, main_only) if path is not None else None
        if (
            name in MAIN_ONLY_WRITES
            and isinstance(call.func, cst.Attribute)
            and facts.is_accelerator(call.func.value, call)
        ):
            path = _argument(call, *MAIN_ONLY_WRITES[name])
            return (path, True) if path is not None else None
        if name in {"save", "save_file"} and facts.callee_is(call, frozenset(WRITE_FUNCTIONS)):
            for qualified in facts.qualified_names(call.func):
                if qualified in WRITE_FUNCTIONS:
                    path = _argument(call, *WRITE_FUNCTIONS[qualified])
                    return (path, False) if path is not None else None
        return None

    def _read(self, call: cst.Call, name: str) -> list[cst.BaseExpression] | None:
        facts = self.facts
        if name == "from_pretrained":
            named = _keyword(call, "pretrained_model_name_or_path") or _keyword(call, "model_id")
            if named is not None:
                return [named]
            # `PeftModel.from_pretrained(base, path)` names the path second
            return [a.value for a in call.args[:2] if a.keyword is None and not a.star] or None
        if (
            name in ACCELERATOR_READS
            and isinstance(call.func, cst.Attribute)
            and facts.is_accelerator(call.func.value, call)
        ):
            path = _argument(call, *ACCELERATOR_READS[name])
            return [path] if path is not None else None
        if name in {"load", "load_file"} and facts.callee_is(call, frozenset(READ_FUNCTIONS)):
            for qualified in facts.qualified_names(call.func):
                if qualified in READ_FUNCTIONS:
                    path = _argument(call, *READ_FUNCTIONS[qualified])
                    return [path] if path is not None else None
        return None

    def _values(self, path: cst.BaseExpression, at: cst.CSTNode) -> set[str]:
        """What a path can be, by value: the texts of the expressions it can come from (a parameter nobody here
        passes stands for itself)."""
        keys = set()
        for origin in self.facts.origins(path, at):
            node = origin.node
            if isinstance(node, cst.Param):
                keys.add(f"parameter {id(node)}")
            elif isinstance(node, cst.BaseExpression) and not isinstance(node, (cst.Integer, cst.Float)):
                text = "".join(cst.Module([]).code_for_node(node).split())
                if text not in {"None", "True", "False"}:
                    keys.add(text)
        return keys

    def _temporary(self, path: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """The path lies in a temporary folder this process made (``with tempfile.TemporaryDirectory() as d``,
        ``d = tempfile.mkdtemp()``): no other process reads it."""
        facts = self.facts
        names = {n.value for n in facts.within(path, cst.Name)} if facts.index.order(path) >= 0 else set()
        for origin in facts.origins(path, at):
            if isinstance(origin.node, cst.Call) and facts.callee_is(origin.node, TEMPORARY):
                return True
            if origin.node is not path and facts.index.order(origin.node) >= 0:
                names |= {n.value for n in facts.within(origin.node, cst.Name)}
        for ancestor in facts.ancestors(at):
            if isinstance(ancestor, cst.With):
                for item in ancestor.items:
                    bound = item.asname.name if item.asname is not None else None
                    if (
                        isinstance(bound, cst.Name)
                        and bound.value in names
                        and isinstance(item.item, cst.Call)
                        and facts.callee_is(item.item, TEMPORARY)
                    ):
                        return True
        return False

    def _deepspeed(self) -> bool:
        if "ld403 deepspeed" not in self.facts._memo:
            backend = self.settings.backend
            self.facts._memo["ld403 deepspeed"] = (
                backend is not None and str(backend.value).upper() == "DEEPSPEED"
            ) or any(
                facts_call
                for facts_call in self.facts.calls
                if self.facts.method_name(facts_call) in {"DummyOptim", "DummyScheduler"}
                and self.facts.callee_is(facts_call, DEEPSPEED_PLACEHOLDERS)
            )
        return self.facts._memo["ld403 deepspeed"]

    # -- order and barriers -------------------------------------------------------------------

    def _anchors(self, call: cst.Call, *, reading: bool) -> list[tuple[cst.CSTNode, bool]]:
        """The places ``call`` runs from: the call, then the calls of its function in this file (up to
        ``MAX_LIFT`` levels), each with whether a rank guard stands on the way. A read under a guard is dropped
        (the main process reads its own write)."""
        facts = self.facts
        anchors: list[tuple[cst.CSTNode, bool]] = []
        pending = [(call, False, 0)]
        seen: set[int] = set()
        while pending:
            node, guarded, depth = pending.pop()
            guarded = guarded or facts.rank_guard(node) is not None
            if reading and guarded:
                continue
            anchors.append((node, guarded))
            function = facts.enclosing_function(node)
            if function is None or depth >= MAX_LIFT or id(function) in seen:
                continue
            seen.add(id(function))
            pending.extend((site, guarded, depth + 1) for site in facts.call_sites(function))
        return anchors

    def _unordered(self, write: cst.Call, main_only: bool, read_anchors: list[tuple[cst.CSTNode, bool]]):
        """(the write's anchor, the read's anchor) where the write runs on the main process only, comes first in
        one function, and no barrier runs between them; None when there is none."""
        facts = self.facts
        index = facts.index
        for write_anchor, guarded in self._anchors(write, reading=False):
            if not (guarded or main_only):
                continue
            scope = facts.enclosing_function(write_anchor)
            for read_anchor, _ in read_anchors:
                if facts.enclosing_function(read_anchor) is not scope:
                    continue
                if index.order(read_anchor) <= index.end(write_anchor) or self._exclusive(write_anchor, read_anchor):
                    continue
                if not self._barrier_between(write_anchor, read_anchor):
                    return write_anchor, read_anchor
        return None

    def _exclusive(self, first: cst.CSTNode, second: cst.CSTNode) -> bool:
        """The two never run in one job: they sit in different branches of an ``if`` that is not a rank test
        (the branches of ``if rank == 0: ... else: ...`` run at the same time, on different ranks)."""
        facts = self.facts
        for ancestor in facts.ancestors(first):
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
                return False
            if isinstance(ancestor, cst.If) and ancestor.orelse is not None:
                here = facts.is_within(first, ancestor.body)
                there = facts.is_within(second, ancestor.orelse if here else ancestor.body)
                if there:
                    return not facts.rank_dependent(ancestor.test)
            elif isinstance(ancestor, cst.Try) and not facts.is_within(second, ancestor):
                continue
            elif isinstance(ancestor, cst.Try) and facts.exclusive(first, second):
                return True
        return False

    def _barrier_between(self, first: cst.CSTNode, second: cst.CSTNode) -> bool:
        facts = self.facts
        index = facts.index
        start, stop = index.end(first), index.order(second)
        for call in facts.calls:
            position = index.order(call)
            if position < start or position >= stop:
                continue
            if self._reaches_barrier(call):
                return True
        return False

    def _reaches_barrier(self, call: cst.Call) -> bool:
        """``call`` is a barrier, or a function that calls one: of this file, or of another module of the project
        (``comm.synchronize()``); an installed library's ``synchronize()`` counts by its name."""
        facts = self.facts
        if self._is_barrier(call):
            return True
        name = facts.method_name(call)
        for function in facts.local_functions(call):
            if any(self._is_barrier(inner) for inner in facts.reachable_calls(function)):
                return True
        if name not in WRITE_OR_READ_NAMES and facts.project is not None and facts.imported_root(call.func):
            for qualified in facts.qualified_names(call.func):
                definition = facts.project.definition(qualified, BARRIER_MARKERS)
                if definition is not None and isinstance(definition[1], cst.FunctionDef):
                    other, function = definition
                    if any(other.method_name(inner) in SYNCHRONISING for inner in other.reachable_calls(function)):
                        return True
        return name in SYNCHRONISE_NAMES and not facts.callee_is(call, DEVICE_SYNCHRONISE)

    def _is_barrier(self, call: cst.Call) -> bool:
        """A barrier, whatever object it is called on (`accelerator.wait_for_everyone()`, `dist.barrier()`,
        `fabric.barrier()`, `trainer.strategy.barrier()`), or a collective of Python objects, which no rank
        leaves before every rank has joined it (`dist.broadcast_object_list`, accelerate's `gather_object`)."""
        return self.facts.method_name(call) in SYNCHRONISING

    # -- the report and its fix ---------------------------------------------------------------

    def _report(self, read: cst.Call, write: cst.Call, found: tuple[cst.CSTNode, cst.CSTNode]) -> None:
        write_anchor, read_anchor = found
        writer = get_full_name_for_node(write.func) or "the write"
        readers = "the other ranks read" if self.facts.rank_split(read_anchor) is not None else "every rank reads"
        message = (
            f"`{writer}(...)` writes this file on the main process only and {readers} it here with no barrier in "
            "between: they can read it before it exists, half-written, or left over from an earlier run"
        )
        fix, why = self._fix(write_anchor, read_anchor)
        if fix is None:
            message += f"; add a barrier before the read ({why})"
        self.report(read, message, fix=fix)

    def _fix(self, write_anchor: cst.CSTNode, read_anchor: cst.CSTNode) -> tuple[Fix | None, str]:
        facts = self.facts
        statement = next(
            (
                a
                for a in [read_anchor, *facts.ancestors(read_anchor)]
                if isinstance(a, (cst.SimpleStatementLine, cst.BaseCompoundStatement))
            ),
            None,
        )
        if statement is None or not isinstance(facts.parent(statement), (cst.IndentedBlock, cst.Module)):
            return None, "lintdist finds no statement to put it before"
        reach = facts.all_ranks_reach(statement)
        if reach.value is not True:
            return None, barrier_unsafe(reach)
        barrier, imports, spelled = self._barrier(write_anchor, read_anchor)
        line = cst.SimpleStatementLine(
            body=[cst.Expr(cst.parse_expression(barrier))], leading_lines=statement.leading_lines
        )
        moved = statement.with_changes(leading_lines=())
        fix = Fix(
            Applicability.SAFE,
            f"Insert `{spelled}` before the read",
            replacements=((statement, cst.FlattenSentinel([line, moved])),),
            imports=imports,
        )
        return fix, ""

    def _barrier(self, write_anchor: cst.CSTNode, read_anchor: cst.CSTNode) -> tuple[str, tuple, str]:
        """The barrier as this script would spell it, the imports it needs, and its text for the message."""
        facts = self.facts
        accelerator = facts.accelerator_at(read_anchor)
        if accelerator is not None:
            text = f"{accelerator}.wait_for_everyone()"
            return text, (), text
        if facts.imports("accelerate"):
            return "PartialState().wait_for_everyone()", (("accelerate", "PartialState"),), "wait_for_everyone()"
        module = facts.distributed_at(read_anchor)
        if module is None:
            return "torch.distributed.barrier()", (("torch.distributed", None),), "torch.distributed.barrier()"
        return f"{module}.barrier()", (), f"{module}.barrier()"


def _argument(call: cst.Call, keyword: str, position: int) -> cst.BaseExpression | None:
    return argument_of(call, keyword, position)


def _keyword(call: cst.Call, keyword: str) -> cst.BaseExpression | None:
    return next((a.value for a in call.args if a.keyword is not None and a.keyword.value == keyword), None)
