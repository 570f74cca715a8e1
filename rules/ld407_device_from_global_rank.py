"""LD407 device-from-global-rank: a CUDA device index taken from the global rank, or every rank left on GPU 0."""

from __future__ import annotations

import re

import libcst as cst

from lintdist.devices import current_device, device_indices, starts_nccl_group, string_device_index
from lintdist.environment import environment_key
from lintdist.facts import argument_of
from lintdist.model import Applicability, Fix, Severity
from lintdist.rank_values import global_rank, global_rank_read, unconverted
from lintdist.rule import Invalid, Pattern, Rule, Valid

# What makes a per-process device without an index: set per process, every rank keeps the current device, GPU 0.
# A device picked per process, by the script or by an API that does it for it: torch 2.13's DeviceMesh sets
# `LOCAL_RANK`'s device when none is set (`device_mesh.py::_setup_world_group_and_device`), and accelerate's
# `PartialState` (built by `Accelerator`) calls `set_device` for every GPU backend.
PINNED = re.compile(
    r"CUDA_VISIBLE_DEVICES|set_device|torch\.cuda\.device\(|init_device_mesh|DeviceMesh\(|Accelerator\(|PartialState\("
)


class DeviceFromGlobalRank(Rule):
    """
    ## What it does
    Reports a CUDA device chosen with the *global* rank: `torch.cuda.set_device(r)`,
    `DistributedDataParallel(..., device_ids=[r], output_device=r)`,
    `init_process_group(..., device_id=r)`,
    `torch.device("cuda", r)`, `f"cuda:{r}"` (also `"cuda:{}".format(r)`,
    `"cuda:%d" % r`, `"cuda:" + str(r)`), `.to(r)` and `.cuda(r)`, where `r`
    is `dist.get_rank()`, `int(os.environ["RANK"])` (`os.environ.get`,
    `os.getenv`), an Accelerator's or `PartialState`'s `process_index`, or a
    name, attribute (`args.rank`, `self.rank`) or parameter whose value comes
    from one of them (a helper returning `dist.get_rank()`, in this file or one
    module of the project away, included). The
    value is followed through the file's assignments, not guessed from the
    name: `local_rank = dist.get_rank()` is reported, `rank =
    int(os.environ["LOCAL_RANK"])` is not. Not reported: `rank %
    torch.cuda.device_count()` (or any expression computed from the rank),
    `LOCAL_RANK`, `local_process_index`, a parameter with no caller in sight,
    scripts that start their own processes with `mp.spawn` (the spawned
    index is the local rank of a one-node job), scripts whose launch lines
    all run them on one node (`python train.py`, `torchrun` without
    `--nnodes` or with `--nnodes 1`, `srun -N 1`, `mpiexec -n 1`, an
    `accelerate launch` with `--num_machines 1`), where the global rank is
    the local one, and test modules (`tests/`, `test_*.py`: launched on one
    node by their own harness).

    It also reports, in a script that starts an NCCL process group
    (`init_process_group("nccl")`, or with no backend), the first `.cuda()`
    without an index, `.to("cuda")` or `torch.device("cuda")` when the script
    never picks a device per process (`torch.cuda.set_device`,
    `torch.cuda.device(...)`, `CUDA_VISIBLE_DEVICES`). A group of one process
    (`world_size=1`) is not reported, nor a script whose launch runs one
    process (`python train.py`, `mpiexec -n 1`, `srun -n 1`).

    ## Why is this bad?
    Device indices are per machine: with 8 GPUs per node, the processes of
    the second node have global ranks 8 to 15 and `set_device(8)` fails with
    "CUDA error: invalid device ordinal". The script works on one node, where global
    and local ranks coincide, and breaks the day it runs on two. Without any
    per-process device, `"cuda"` means the current device, GPU 0, for every
    process: they all allocate there, NCCL sees several ranks on one GPU
    and the job fails or runs out of memory.

    ## Example
    ```python
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    ```

    ## Use instead
    ```python
    import os

    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    ```

    ## Fix safety
    Unsafe, and only where the rank is read at the device call itself:
    `os.environ["RANK"]` (or `.get("RANK")`, `os.getenv("RANK")`) becomes the
    same read of `"LOCAL_RANK"`, and `accelerator.process_index` becomes
    `accelerator.local_process_index`. A launcher that sets `RANK` but not
    `LOCAL_RANK` (a hand-written `srun` line) would then raise `KeyError`.
    A rank kept in a variable has no fix: the variable is the global rank
    elsewhere too (logging, sampler, saving), so a separate local rank is
    needed.

    ## References
    - torchrun sets `RANK` (global) and `LOCAL_RANK` (per node); its documentation uses
      `local_rank = int(os.environ["LOCAL_RANK"])` to pick the device.
    - meta-llama/llama-cookbook#90: `torch.cuda.set_device(rank)` fails with "invalid device ordinal" on the
      second node; the fix is `local_rank`.
    - LMCache/LMCache#814: the global rank used as device id fails once it reaches the per-node GPU count.
    """

    code = "LD407"
    name = "device-from-global-rank"
    severity = Severity.WARNING
    needs_several_processes = True
    fix_kind = "unsafe"
    # a global rank read next to a device choice, or an NCCL group with a device given by no index
    triggers = (
        Pattern(
            ("get_rank", "RANK", "process_index"),
            # the name's start checked after the literal (a lookbehind first is tried at every position: 3x slower)
            re.compile(r"get_rank\((?<!\wget_rank\()|[\"']RANK[\"']|process_index\s*[\]),}\n]"),
        ),
        Pattern(("init_process_group",), re.compile(r"\.cuda\(\)|[\"']cuda[\"']")),
    )
    also_triggers = (("set_device", "device_id", "cuda", ".to(", "torch.device(", "xpu:", "npu:", "hpu:", "mlu:"),)

    VALID = (
        Valid(
            """\
import os
import torch
import torch.distributed as dist

dist.init_process_group("nccl")
rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(rank)
"""
        ),
        Valid(
            """\
import torch
import torch.distributed as dist

dist.init_process_group("nccl")
torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())
model = model.cuda()
"""
        ),
        Valid(
            """\
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

def worker(rank, world_size):
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    torch.cuda.set_device(rank)
    model = Net().to(rank)

mp.spawn(worker, args=(2,), nprocs=2)
"""
        ),
        Valid(
            """\
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
model = Net().cuda()
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
local_rank = dist.get_rank()
torch.cuda.set_device(local_rank)
model = DDP(model, device_ids=[local_rank])
""",
            lines=(7, 8),
        ),
        Invalid(
            """\
import os
import torch

device = torch.device("cuda", int(os.environ["RANK"]))
""",
            lines=(4,),
            unsafe_fixed="""\
import os
import torch

device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
""",
        ),
        Invalid(
            """\
import os
import torch.distributed as dist

dist.init_process_group("nccl", device_id=int(os.getenv("RANK", "0")))
""",
            lines=(4,),
            unsafe_fixed="""\
import os
import torch.distributed as dist

dist.init_process_group("nccl", device_id=int(os.getenv("LOCAL_RANK", "0")))
""",
        ),
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
model = model.to(f"cuda:{accelerator.process_index}")
""",
            lines=(4,),
            unsafe_fixed="""\
from accelerate import Accelerator

accelerator = Accelerator()
model = model.to(f"cuda:{accelerator.local_process_index}")
""",
        ),
        Invalid(
            """\
import torch.distributed as dist

class Trainer:
    def __init__(self):
        dist.init_process_group("nccl")
        self.rank = dist.get_rank()

    def setup(self, model):
        return model.cuda(self.rank)
""",
            lines=(9,),
        ),
        Invalid(
            """\
import torch
import torch.distributed as dist

dist.init_process_group(backend="nccl")
model = Net().cuda()
for batch in loader:
    loss = model(batch.cuda()).sum()
""",
            lines=(5,),
        ),
    )

    def finish(self) -> None:
        if self.context.is_test_module:
            return
        facts = self.facts
        for call in facts.calls:
            for index in device_indices(facts, call):
                self._check(index)
        for string in facts.index.nodes(cst.FormattedString, cst.BinaryOperation):
            index = string_device_index(string)
            if index is not None:
                self._check(index)
        self._unpinned()

    def _check(self, index: cst.BaseExpression) -> None:
        if self.launch.one_node:
            return  # one node (a launch line, or `mp.spawn` in the script): the global rank is the local one
        source = global_rank(self.facts, index, index)
        if source is None:
            return
        text = cst.Module([]).code_for_node(index)
        shown = f"`{text}` is the global rank" + ("" if text == source.strip("`") else f" ({source})")
        self.report(
            index,
            f"{shown}, not this process's GPU on its node: on a second node it "
            'is past the last device ("invalid device ordinal"); use the local rank '
            '(`int(os.environ["LOCAL_RANK"])`, `accelerator.local_process_index`) or `rank % '
            "torch.cuda.device_count()`",
            fix=self._fix(index),
        )

    def _fix(self, index: cst.BaseExpression) -> Fix | None:
        """``"RANK"`` read right here becomes ``"LOCAL_RANK"``; ``x.process_index`` here, ``x.local_process_index``."""
        expr = unconverted(index)
        if global_rank_read(self.facts, expr) is None:
            return None
        if isinstance(expr, cst.Attribute):
            new = expr.with_changes(attr=cst.Name("local_process_index"))
            return Fix(Applicability.UNSAFE, "Use `local_process_index`", replacements=((expr, new),))
        if environment_key(self.facts, expr) is None:
            return None
        key = expr.slice[0].slice.value if isinstance(expr, cst.Subscript) else argument_of(expr, "key", 0)
        quote = key.value[0]
        new_key = key.with_changes(value=f"{quote}LOCAL_RANK{quote}")
        return Fix(Applicability.UNSAFE, "Read `LOCAL_RANK` instead of `RANK`", replacements=((key, new_key),))

    def _unpinned(self) -> None:
        """An NCCL script that never picks a device per process: every `cuda` without an index is GPU 0."""
        facts = self.facts
        # one-process launches are skipped by the engine
        if PINNED.search(self.context.text or "") or not any(starts_nccl_group(facts, call) for call in facts.calls):
            return
        sites = [call for call in facts.calls if current_device(facts, call)]
        if not sites:
            return
        more = f" (and {len(sites) - 1} more place(s) in this file)" if len(sites) > 1 else ""
        self.report(
            sites[0],
            "this NCCL script never picks a GPU per process (`torch.cuda.set_device`), so `cuda` without an "
            f"index is GPU 0 on every rank{more}: they all share one GPU; call "
            '`torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))` after `init_process_group`',
        )
