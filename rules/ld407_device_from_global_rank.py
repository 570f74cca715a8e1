"""LD407 device-from-global-rank: a CUDA device index taken from the global rank, or every rank left on GPU 0."""

from __future__ import annotations

import itertools
import re

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import DDP_WRAPPERS, argument_of, string_value
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Pattern, Rule, Valid

SET_DEVICE = frozenset({"torch.cuda.set_device", "torch.cuda.device", "torch.accelerator.set_device_index"})
TORCH_DEVICE = frozenset({"torch.device"})
GET_RANK = frozenset(
    {"torch.distributed.get_rank", "torch.distributed.distributed_c10d.get_rank", "torch.distributed.get_global_rank"}
)
INIT_PROCESS_GROUP = frozenset(
    {"torch.distributed.init_process_group", "torch.distributed.distributed_c10d.init_process_group"}
)
SPAWNS = frozenset({"torch.multiprocessing.spawn", "torch.multiprocessing.start_processes"})
ENVIRON = frozenset({"os.environ"})
GETENV = frozenset({"os.getenv", "os.environ.get"})
STATE_CLASSES = frozenset(
    {"accelerate.PartialState", "accelerate.state.PartialState", "accelerate.AcceleratorState"}
    | {"accelerate.state.AcceleratorState"}
)
CONVERSIONS = frozenset({"int", "str"})
# What makes a per-process device without an index: set per process, every rank keeps the current device, GPU 0.
# A device picked per process, by the script or by an API that does it for it: torch 2.13's DeviceMesh sets
# `LOCAL_RANK`'s device when none is set (`device_mesh.py::_setup_world_group_and_device`), and accelerate's
# `PartialState` (built by `Accelerator`) calls `set_device` for every GPU backend.
PINNED = re.compile(
    r"CUDA_VISIBLE_DEVICES|set_device|torch\.cuda\.device\(|init_device_mesh|DeviceMesh\(|Accelerator\(|PartialState\("
)
MAX_DEPTH = 4
# A module none of whose text reads a rank cannot hold a helper that returns the global one.
HELPER_MARKERS = ("get_rank", "RANK", "process_index")


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
            re.compile(r"(?<!\w)get_rank\(|[\"']RANK[\"']|process_index\s*[\]),}\n]"),
        ),
        Pattern(("init_process_group",), re.compile(r"\.cuda\(\)|[\"']cuda[\"']")),
    )
    also_triggers = (("set_device", "device_id", "cuda", ".to("),)

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

    _crossed = False  # asked from another module: follow no further helpers

    def finish(self) -> None:
        if self.context.is_test_module:
            return
        facts = self.facts
        self._spawns = any(
            facts.method_name(call) in {"spawn", "start_processes"} and facts.callee_is(call, SPAWNS)
            for call in facts.calls
        )
        for call in facts.calls:
            for index in self._device_indices(call):
                self._check(index)
        for string in facts.index.nodes(cst.FormattedString, cst.BinaryOperation):
            index = _string_index(string)
            if index is not None:
                self._check(index)
        self._unpinned()

    # -- where a device index is given ---------------------------------------------------------------

    def _device_indices(self, call: cst.Call) -> list[cst.BaseExpression]:
        facts = self.facts
        func = call.func
        name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
        found: list[cst.BaseExpression] = []
        if name in {"to", "cuda"} and isinstance(func, cst.Attribute):
            value = argument_of(call, "device", 0)
            if value is not None:
                found.append(value)
        elif name == "format" and isinstance(func, cst.Attribute) and _cuda_prefix(func.value):
            value = argument_of(call, "", 0)
            if value is not None:
                found.append(value)
        elif name in {"set_device", "device", "set_device_index"} and facts.callee_is(call, SET_DEVICE):
            value = argument_of(call, "device", 0)
            if value is not None:
                found.append(value)
        elif name == "device" and facts.callee_is(call, TORCH_DEVICE):
            kind, index = argument_of(call, "type", 0), argument_of(call, "index", 1)
            if index is not None and string_value(kind) == "cuda":
                found.append(index)
            elif index is None and kind is not None and string_value(kind) is None:
                found.append(kind)  # `torch.device(rank)`: an integer is a CUDA index
        elif name == "init_process_group" and facts.callee_is(call, INIT_PROCESS_GROUP):
            value = argument_of(call, "device_id", 8)  # torch 2.13: `device_id: torch.device | int | None`
            if value is not None:
                found.append(value)
        elif len(call.args) >= 2 and facts.callee_is(call, DDP_WRAPPERS):  # `DDP(model)` names no device
            ids = argument_of(call, "device_ids", 1)
            if isinstance(ids, (cst.List, cst.Tuple)):
                found.extend(e.value for e in ids.elements if not isinstance(e, cst.StarredElement))
            output = argument_of(call, "output_device", 2)
            if output is not None:
                found.append(output)
        return found

    def _check(self, index: cst.BaseExpression) -> None:
        if self._spawns or self.launch.one_node:
            return  # one node: the global rank is the local one
        source = self._global_rank(index, index, 0)
        if source is None:
            return
        text = cst.Module([]).code_for_node(index)
        shown = (
            f"`{text}` is the global rank" if text == source.strip("`") else f"`{text}` is the global rank ({source})"
        )
        self.report(
            index,
            f"{shown}, not this process's GPU on its node: on a second node it "
            'is past the last device ("invalid device ordinal"); use the local rank '
            '(`int(os.environ["LOCAL_RANK"])`, `accelerator.local_process_index`) or `rank % '
            "torch.cuda.device_count()`",
            fix=self._fix(index),
        )

    # -- what a value is -----------------------------------------------------------------------------

    def _global_rank(self, expr: cst.BaseExpression, at: cst.CSTNode, depth: int) -> str | None:
        """How ``expr`` is the global rank (for the message), or None."""
        facts = self.facts
        if depth > MAX_DEPTH:
            return None
        if isinstance(expr, cst.Call) and get_full_name_for_node(expr.func) in CONVERSIONS and expr.args:
            return self._global_rank(expr.args[0].value, at, depth)
        atom = self._atom(expr)
        if atom is not None:
            return atom
        if isinstance(expr, (cst.Name, cst.Attribute, cst.Call)):
            for origin in facts.origins(expr, at):
                node = origin.node
                if node is expr or origin.index is not None or not isinstance(node, cst.BaseExpression):
                    continue
                found = self._global_rank(node, node, depth + 1)
                if found is not None:
                    return found
        return None

    def _atom(self, expr: cst.BaseExpression) -> str | None:
        facts = self.facts
        if isinstance(expr, cst.Call):
            func = expr.func
            last = func.attr.value if isinstance(func, cst.Attribute) else getattr(func, "value", "")
            if last in {"get_rank", "get_global_rank"} and facts.callee_is(expr, GET_RANK):
                return "`dist.get_rank()`"
            helper = self._helper_rank(expr)
            if helper is not None:
                return helper
            rank_key = string_value(argument_of(expr, "key", 0)) == "RANK"
            if rank_key and last in {"get", "getenv"} and facts.callee_is(expr, GETENV):
                return '`os.environ["RANK"]`'
            return None
        if isinstance(expr, cst.Subscript) and facts.qualified_names(expr.value) & ENVIRON:
            element = expr.slice[0].slice if len(expr.slice) == 1 else None
            if isinstance(element, cst.Index) and string_value(element.value) == "RANK":
                return '`os.environ["RANK"]`'
            return None
        if isinstance(expr, cst.Attribute) and expr.attr.value == "process_index":
            owner = expr.value
            if facts.accelerator_like(owner, expr) or any(
                isinstance(o.node, cst.Call) and facts.callee_is(o.node, STATE_CLASSES) for o in facts.origins(owner)
            ):
                return "accelerate's `process_index` counts processes on all nodes"
        return None

    def _helper_rank(self, call: cst.Call) -> str | None:
        """``utils.get_rank()``: a function of another project module that returns the global rank (timm's and
        dino's helpers return ``dist.get_rank()``), followed one module deep."""
        facts = self.facts
        if facts.project is None or self._crossed or facts.local_functions(call) or not facts.imported_root(call.func):
            return None
        for qualified in facts.qualified_names(call.func):
            found = facts.project.definition(qualified, HELPER_MARKERS)
            if found is None or not isinstance(found[1], cst.FunctionDef):
                continue
            other, function = found
            there = self.elsewhere(other)
            there._crossed = True
            for returned in other.returns.get(function, ()):
                how = there._global_rank(returned, returned, 1)
                if how is not None:
                    return f"`{qualified.rsplit('.', 1)[-1]}()` returns {how}"
        return None

    def _fix(self, index: cst.BaseExpression) -> Fix | None:
        """``"RANK"`` read right here becomes ``"LOCAL_RANK"``; ``x.process_index`` here, ``x.local_process_index``."""
        expr = index
        while isinstance(expr, cst.Call) and get_full_name_for_node(expr.func) in CONVERSIONS and expr.args:
            expr = expr.args[0].value
        if self._atom(expr) is None:
            return None
        if isinstance(expr, cst.Attribute):
            new = expr.with_changes(attr=cst.Name("local_process_index"))
            return Fix(Applicability.UNSAFE, "Use `local_process_index`", replacements=((expr, new),))
        key = None
        if isinstance(expr, cst.Subscript):
            key = expr.slice[0].slice.value
        elif isinstance(expr, cst.Call) and self.facts.callee_is(expr, GETENV):
            key = argument_of(expr, "key", 0)
        if isinstance(key, cst.SimpleString):
            quote = key.value[0]
            new_key = key.with_changes(value=f"{quote}LOCAL_RANK{quote}")
            return Fix(Applicability.UNSAFE, "Read `LOCAL_RANK` instead of `RANK`", replacements=((key, new_key),))
        return None

    # -- NCCL with every process on the current device -------------------------------------------------

    def _unpinned(self) -> None:
        facts = self.facts
        if PINNED.search(self.context.text or "") or self.launch.one_process:
            return
        if not any(facts.callee_is(call, INIT_PROCESS_GROUP) and self._nccl(call) for call in facts.calls):
            return
        sites = [call for call in facts.calls if _default_device(facts, call)]
        if not sites:
            return
        more = f" (and {len(sites) - 1} more place(s) in this file)" if len(sites) > 1 else ""
        self.report(
            sites[0],
            "this NCCL script never picks a GPU per process (`torch.cuda.set_device`), so `cuda` without an "
            f"index is GPU 0 on every rank{more}: they all share one GPU; call "
            '`torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))` after `init_process_group`',
        )

    def _nccl(self, call: cst.Call) -> bool:
        size = argument_of(call, "world_size", 4)
        if isinstance(size, cst.Integer) and size.evaluated_value == 1:
            return False  # one process (a test's group): it owns GPU 0
        backend = argument_of(call, "backend", 0)
        if backend is None:
            return True  # the default: NCCL for CUDA tensors
        for origin in self.facts.origins(backend, call):
            value = string_value(origin.node) if isinstance(origin.node, cst.BaseExpression) else None
            if value is not None and "nccl" in value.lower():
                return True
        return False


def _default_device(facts, call: cst.Call) -> bool:
    """``x.cuda()``, ``x.to("cuda")``, ``torch.device("cuda")``: the current device, with no index."""
    func = call.func
    if not isinstance(func, (cst.Attribute, cst.Name)):
        return False
    name = func.attr.value if isinstance(func, cst.Attribute) else func.value
    if name == "cuda" and isinstance(func, cst.Attribute) and argument_of(call, "device", 0) is None:
        return get_full_name_for_node(func.value) != "torch"  # `.cuda()`, `.cuda(non_blocking=True)`
    if name == "to" and isinstance(func, cst.Attribute):
        return string_value(argument_of(call, "device", 0)) == "cuda"
    if name == "device" and len(call.args) == 1 and facts.callee_is(call, TORCH_DEVICE):
        return string_value(call.args[0].value) == "cuda"
    return False


def _cuda_prefix(expr: cst.BaseExpression) -> bool:
    value = string_value(expr)
    return value is not None and value.startswith("cuda:")


def _string_index(node: cst.CSTNode) -> cst.BaseExpression | None:
    """``r`` of ``f"cuda:{r}"``, ``"cuda:%d" % r``, ``"cuda:" + str(r)``."""
    if isinstance(node, cst.BinaryOperation):
        if isinstance(node.operator, (cst.Modulo, cst.Add)) and _cuda_prefix(node.left):
            right = node.right
            if isinstance(right, cst.Tuple) and len(right.elements) == 1:
                right = right.elements[0].value
            return right
        return None
    parts = node.parts
    for before, after in itertools.pairwise(parts):
        if (
            isinstance(before, cst.FormattedStringText)
            and before.value.endswith("cuda:")
            and isinstance(after, cst.FormattedStringExpression)
        ):
            return after.expression
    return None
