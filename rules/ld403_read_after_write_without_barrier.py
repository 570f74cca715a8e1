"""LD403 read-after-write-without-barrier: a file written on the main process and read by every rank with no
barrier in between, so the other ranks read a missing or stale file."""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.barriers import barrier_spelling, guarded_places, unwaited
from lintdist.blocks import statement_before
from lintdist.control import statement_of
from lintdist.facts import MAIN_FLAGS, MAIN_ONLY_DECORATORS, RANK_GETTERS, RANK_NAMES, barrier_unsafe
from lintdist.file_io import READ_NAMES, WRITE_NAMES, file_reads, file_writes, path_values, temporary_path
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Rule, Valid, words
from lintdist.sharding import builds_deepspeed_placeholders

# Writes and reads are not followed into another module's `save`/`load` helpers to look for a barrier.
WRITE_OR_READ_NAMES = frozenset({"save", "load", "save_pretrained", "from_pretrained", "save_state", "load_state"})
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
        names = {facts.method_name(call) for call in facts.calls}
        if not names & WRITE_NAMES or not names & READ_NAMES:
            return
        writes, reads = file_writes(facts), file_reads(facts)
        # the values a path can have first; whether it lies in a temporary folder only for a pair that matches
        keys = {id(write_call): path_values(facts, write_path, write_call) for write_call, write_path, _ in writes}
        written = set().union(*keys.values())
        if not written or not reads:
            return
        for read_call, read_paths in reads:
            values = [(path, path_values(facts, path, read_call)) for path in read_paths]
            if not any(found & written for _, found in values):
                continue
            read_keys = {key for path, found in values if not temporary_path(facts, path, read_call) for key in found}
            read_places = guarded_places(facts, read_call, MAX_LIFT, unguarded_only=True) if read_keys else []
            for write_call, write_path, main_only in writes if read_places else ():
                if not read_keys & keys[id(write_call)] or temporary_path(facts, write_path, write_call):
                    continue
                if facts.method_name(write_call) == "save_state" and self._deepspeed():
                    continue  # DeepSpeed's `save_checkpoint` ends with a barrier
                write_places = guarded_places(facts, write_call, MAX_LIFT)
                found = unwaited(facts, write_places, main_only, read_places, opaque=WRITE_OR_READ_NAMES)
                if found is not None:
                    self._report(read_call, write_call, found[1])
                    break

    def _deepspeed(self) -> bool:
        backend = self.settings.backend
        deepspeed = backend is not None and str(backend.value).upper() == "DEEPSPEED"
        return deepspeed or builds_deepspeed_placeholders(self.facts)

    def _report(self, read: cst.Call, write: cst.Call, read_anchor: cst.CSTNode) -> None:
        writer = get_full_name_for_node(write.func) or "the write"
        readers = "the other ranks read" if self.facts.rank_split(read_anchor) is not None else "every rank reads"
        message = (
            f"`{writer}(...)` writes this file on the main process only and {readers} it here with no barrier in "
            "between: they can read it before it exists, half-written, or left over from an earlier run"
        )
        fix, why = self._fix(read_anchor)
        if fix is None:
            message += f"; add a barrier before the read ({why})"
        self.report(read, message, fix=fix)

    def _fix(self, read_anchor: cst.CSTNode) -> tuple[Fix | None, str]:
        facts = self.facts
        statement = statement_of(facts, read_anchor)
        if statement is None or not isinstance(facts.parent(statement), (cst.IndentedBlock, cst.Module)):
            return None, "lintdist finds no statement to put it before"
        reach = facts.all_ranks_reach(statement)
        if reach.value is not True:
            return None, barrier_unsafe(reach)
        barrier, imports, spelled = barrier_spelling(facts, read_anchor)
        line = cst.SimpleStatementLine(body=[cst.Expr(cst.parse_expression(barrier))])
        fix = Fix(
            Applicability.SAFE,
            f"Insert `{spelled}` before the read",
            replacements=((statement, statement_before(statement, statement, line)),),
            imports=imports,
        )
        return fix, ""
