"""LD606 load-without-map-location: every rank's `torch.load` restores a CUDA checkpoint onto the GPU it was saved on."""

from __future__ import annotations

import re

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.devices import uses_cuda
from lintdist.edits import keyword_arg
from lintdist.layout import inserted_after
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Rule, Valid

TORCH_LOAD = frozenset({"torch.load", "torch.serialization.load"})
TORCH_SAVE = frozenset({"torch.save", "torch.serialization.save"})
# A path that names a checkpoint (`ckpt_path`, `args.resume`, `"snapshot.pt"`, `f"{out}/model_{step}.pth"`).
CHECKPOINT_PATH = re.compile(r"ckpt|checkpoint|snapshot|resume|state_dict|weights", re.IGNORECASE)


# Objects whose state dict holds numbers, not tensors, named as scripts name them.
TENSORLESS = re.compile(r"scaler|sched|sampler", re.IGNORECASE)


class LoadWithoutMapLocation(Rule):
    """
    ## What it does
    Reports `torch.load(path)` with no `map_location` (neither the keyword
    nor the second positional argument) in a multi-process script that puts
    its work on CUDA devices (an NCCL process group, `set_device`,
    `.cuda()`, `.to(rank)`, `device_ids=[...]`), when every rank runs the
    load (no rank guard around it) and what is loaded is a checkpoint: it
    goes into `load_state_dict`, or its path names one (`ckpt`,
    `checkpoint`, `snapshot`, `resume`, `state_dict`, `weights`).

    Not reported: a `map_location=` of any kind (a device, a string, a
    dict, a callable); a load under a rank guard (`if rank == 0:`, then a
    broadcast); a CPU-only script (gloo and no CUDA device anywhere); a
    script whose own `torch.save` writes CPU tensors (`.cpu()`); a script
    whose launch runs one process; a state loaded into a gradient scaler, a
    scheduler or a sampler, or read from a path that names one, even in a
    checkpoint folder (their state dicts hold numbers, not tensors);
    `accelerator.load_state`, `safetensors` and `from_pretrained`, which
    place tensors themselves.

    ## Why is this bad?
    With `map_location=None`, torch restores every tensor to the device it
    was saved from (`torch/serialization.py`: `_get_restore_location(None)`
    is `default_restore_location`, which calls `_deserialize("cuda", obj,
    location)` with the saved tag, `obj.to(device="cuda:0")`). A checkpoint
    saved by rank 0 of a DDP job holds `cuda:0` tensors, so every rank
    allocates the whole checkpoint on GPU 0 and creates a CUDA context
    there; `torch.cuda.set_device(local_rank)` does not change this. GPU 0
    then runs out of memory, or holds W extra processes' contexts for the
    whole run. A `.to(device)` or `load_state_dict` after the load does not
    help: the copy on GPU 0 is made first and freed only when the object
    goes away.

    ## Example
    ```python
    dist.init_process_group("nccl")
    torch.cuda.set_device(local_rank)
    model = DDP(build_model().cuda(), device_ids=[local_rank])
    checkpoint = torch.load(args.resume)
    model.module.load_state_dict(checkpoint["model"])
    ```

    ## Use instead
    ```python
    dist.init_process_group("nccl")
    torch.cuda.set_device(local_rank)
    model = DDP(build_model().cuda(), device_ids=[local_rank])
    checkpoint = torch.load(args.resume, map_location="cpu")
    model.module.load_state_dict(checkpoint["model"])
    ```

    ## Fix safety
    Unsafe (`--unsafe-fixes`): the fix adds `map_location="cpu"`. Then
    `load_state_dict` copies each tensor to its parameter's own device,
    which is what the script meant, at the cost of one host-to-device copy;
    but a script that uses a loaded tensor or module as it comes out of
    `torch.load` (a whole pickled model, an EMA tensor used in CUDA math)
    now gets it on the CPU and must move it, or fails with a device
    mismatch. `map_location=f"cuda:{local_rank}"` keeps them on a GPU, but
    which name holds the local rank is the script's.

    ## References
    - torch 2.13 `torch/serialization.py::load` (`map_location=None`
      default), `_get_restore_location` (`if map_location is None:
      restore_location = default_restore_location`),
      `default_restore_location` and `_deserialize` (restores to the saved
      location tag, `obj.to(device=device)`)
    - https://github.com/pytorch/examples/issues/1078: the DDP tutorial
      series resumes with `torch.load(snapshot_path)`; all ranks load the
      snapshot to GPU 0; fixed by PR 1079 with `map_location`
    - https://github.com/pytorch/pytorch/issues/23138: resuming the ImageNet
      DDP example puts an extra process of every rank on GPU 0
    - https://github.com/lucidrains/imagen-pytorch/pull/132: `torch.load`
      loaded the state dict onto cuda:0 in every process; fixed with
      `map_location='cpu'`
    - https://github.com/NVIDIA/apex/issues/222: the reporter's fix was to
      pass `map_location` after setting the device
    - Proof: tests/proofs/test_ld606_restore_location.py (gloo, 2 ranks):
      no CPU proof of GPU 0's memory; on CPU, a checkpoint whose tensors
      carry the `cuda:0` tag is restored by every rank to `cuda:0` (a
      `map_location` callable sees the tag on both ranks, and the default
      load fails trying to reach CUDA), while `map_location="cpu"` is
      honoured on both
    """

    code = "LD606"
    name = "load-without-map-location"
    severity = Severity.WARNING
    needs_several_processes = True
    fix_kind = "unsafe"
    # the words other rules test too come first: a file without them is passed over at no cost
    triggers = ("init_process_group", "DistributedDataParallel", "FullyShardedDataParallel", "fully_shard", "Accelerator")
    also_triggers = (("torch.load", "serialization.load"),)

    VALID = (
        Valid(
            """\
import torch
import torch.distributed as dist

dist.init_process_group("nccl")
torch.cuda.set_device(local_rank)
scaler = torch.amp.GradScaler("cuda")
torch.save(scaler.state_dict(), "scaler.pt")
scaler.load_state_dict(torch.load("scaler.pt"))
"""
        ),
        Valid(
            """\
import os
import torch
import torch.distributed as dist

dist.init_process_group("nccl")
torch.cuda.set_device(local_rank)
torch.save(model.state_dict(), os.path.join(run_dir, "checkpoint", "model.pt"))
lr_scheduler.load_state_dict(torch.load(os.path.join(run_dir, "checkpoint", SCHEDULER_FILE)))
"""
        ),
        Valid(
            """\
import torch
import torch.distributed as dist

dist.init_process_group("nccl")
torch.cuda.set_device(local_rank)
checkpoint = torch.load(args.resume, map_location=f"cuda:{local_rank}")
model.load_state_dict(checkpoint["model"])
"""
        ),
        Valid(
            """\
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
checkpoint = torch.load("checkpoint.pt")
model.load_state_dict(checkpoint["model"])
"""
        ),
        Valid(
            """\
import torch
import torch.distributed as dist

dist.init_process_group("nccl")
model = model.cuda(local_rank)
if dist.get_rank() == 0:
    state = torch.load("checkpoint.pt")
    model.load_state_dict(state)
for p in model.parameters():
    dist.broadcast(p.data, src=0)
"""
        ),
        Valid(
            """\
import torch
import torch.distributed as dist

dist.init_process_group("nccl")
model = DDP(model.cuda(local_rank), device_ids=[local_rank])
if dist.get_rank() == 0:
    torch.save({k: v.cpu() for k, v in model.module.state_dict().items()}, "checkpoint.pt")
dist.barrier()
model.module.load_state_dict(torch.load("checkpoint.pt"))
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("nccl")
torch.cuda.set_device(local_rank)
model = DDP(build_model().cuda(), device_ids=[local_rank])
checkpoint = torch.load(args.resume)
model.module.load_state_dict(checkpoint["model"])
""",
            lines=(8,),
            unsafe_fixed="""\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("nccl")
torch.cuda.set_device(local_rank)
model = DDP(build_model().cuda(), device_ids=[local_rank])
checkpoint = torch.load(args.resume, map_location="cpu")
model.module.load_state_dict(checkpoint["model"])
""",
        ),
        Invalid(
            """\
import torch
import torch.distributed as dist


class Trainer:
    def __init__(self, model, snapshot_path):
        self.gpu_id = int(os.environ["LOCAL_RANK"])
        self.model = model.to(self.gpu_id)
        self._load_snapshot(snapshot_path)

    def _load_snapshot(self, snapshot_path):
        snapshot = torch.load(snapshot_path, weights_only=True)
        self.model.load_state_dict(snapshot["MODEL_STATE"])


dist.init_process_group(backend="nccl")
""",
            lines=(12,),
            unsafe_fixed="""\
import torch
import torch.distributed as dist


class Trainer:
    def __init__(self, model, snapshot_path):
        self.gpu_id = int(os.environ["LOCAL_RANK"])
        self.model = model.to(self.gpu_id)
        self._load_snapshot(snapshot_path)

    def _load_snapshot(self, snapshot_path):
        snapshot = torch.load(snapshot_path, map_location="cpu", weights_only=True)
        self.model.load_state_dict(snapshot["MODEL_STATE"])


dist.init_process_group(backend="nccl")
""",
        ),
    )

    def finish(self) -> None:
        facts = self.facts
        torch_loads = [call for call in facts.calls if facts.callee_is(call, TORCH_LOAD)]
        loads = [call for call in torch_loads if self._unmapped(call)]
        if not loads or not facts.sets_up_processes() or not uses_cuda(facts) or self._saves_cpu_tensors():
            return
        mapped = [call for call in torch_loads if not self._unmapped(call)]
        for call in loads:
            if facts.rank_guard(call) is not None or not self._checkpoint(call):
                continue
            if any(facts.exclusive(call, other) for other in mapped):
                continue  # `if args.gpu is None: torch.load(p)` `else: torch.load(p, map_location=loc)`: chosen
            self._report(call)

    def _unmapped(self, call: cst.Call) -> bool:
        """No ``map_location``: no such keyword, no second positional argument, no ``**kwargs``."""
        if any(arg.star for arg in call.args):
            return False
        if any(arg.keyword is not None and arg.keyword.value == "map_location" for arg in call.args):
            return False
        return len([arg for arg in call.args if arg.keyword is None]) == 1

    def _saves_cpu_tensors(self) -> bool:
        """The script's own ``torch.save`` writes tensors moved to the CPU (``v.cpu()``, ``.to("cpu")``)."""
        facts = self.facts
        code = self.context.module.code_for_node
        return any(
            facts.callee_is(call, TORCH_SAVE) and call.args and "cpu" in code(call.args[0].value)
            for call in facts.calls
        )

    def _checkpoint(self, call: cst.Call) -> bool:
        """What is loaded is a training checkpoint: its path names one, or it goes into ``load_state_dict``
        (itself, or the name it is bound to, subscripted or not) in a script that saves checkpoints itself
        (``torch.save``, ``accelerator.save``, ``fabric.save``), so the file may hold its CUDA tensors."""
        facts = self.facts
        path = self.context.module.code_for_node(call.args[0].value)
        parent = facts.parent(facts.parent(call))
        into = parent if isinstance(parent, cst.Call) and facts.method_name(parent) == "load_state_dict" else None
        if TENSORLESS.search(path) or (into is not None and not _holds_tensors(into)):
            return False  # `lr_scheduler.load_state_dict(torch.load(join(checkpoint, SCHEDULER_NAME)))`
        if CHECKPOINT_PATH.search(path):
            return True
        if not any(
            facts.callee_is(c, TORCH_SAVE) or (facts.method_name(c) == "save" and len(c.args) >= 2) for c in facts.calls
        ):
            return False
        if into is not None:
            return True
        statement = facts.parent(call)
        if not isinstance(statement, cst.Assign) or not isinstance(statement.targets[0].target, cst.Name):
            return False
        name = statement.targets[0].target.value
        scope = facts.enclosing_function(call) or facts.index.module
        return any(
            facts.method_name(other) == "load_state_dict"
            and _holds_tensors(other)
            and any(n.value == name for arg in other.args for n in facts.within(arg, cst.Name))
            for other in facts.calls_within(scope)
        )

    def _report(self, call: cst.Call) -> None:
        message = (
            "`torch.load` without `map_location` restores each tensor to the device it was saved on: if this "
            "checkpoint was saved from CUDA tensors, every rank of this multi-GPU job loads it onto that GPU "
            '(usually cuda:0), using its memory and opening a CUDA context there; pass `map_location="cpu"` '
            "(or the rank's device)"
        )
        args = inserted_after(
            call.args, 0, keyword_arg("map_location", cst.SimpleString('"cpu"')), call.whitespace_before_args
        )
        fix = Fix(
            Applicability.UNSAFE,
            'Load with `map_location="cpu"`',
            replacements=((call, call.with_changes(args=args)),),
        )
        self.report(call, message, fix=fix)


def _holds_tensors(load_state_dict: cst.Call) -> bool:
    """The object whose ``load_state_dict`` this is keeps tensors in its state: not a gradient scaler, a learning
    rate scheduler or a sampler, whose states are numbers (torch 2.13 ``GradScaler.state_dict`` returns floats)."""
    receiver = load_state_dict.func.value if isinstance(load_state_dict.func, cst.Attribute) else None
    last = get_full_name_for_node(receiver).rsplit(".", 1)[-1] if receiver is not None else ""
    return not TENSORLESS.search(last or "")
