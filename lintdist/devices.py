"""Which CUDA device code chooses: the index a call or a device string gives (``set_device(i)``, ``.to(i)``,
``DDP(device_ids=[i])``, ``f"cuda:{i}"``), the current device taken without one (``.cuda()``, ``"cuda"``), and
whether ``init_process_group`` starts an NCCL group of several processes (the one that needs a GPU per process)."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import DDP_WRAPPERS, RANK_NAMES, argument_of, string_value

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts

SET_DEVICE = frozenset({"torch.cuda.set_device", "torch.cuda.device", "torch.accelerator.set_device_index"})
TORCH_DEVICE = frozenset({"torch.device"})
INIT_PROCESS_GROUP = frozenset(
    {"torch.distributed.init_process_group", "torch.distributed.distributed_c10d.init_process_group"}
)


def device_indices(facts: PythonFacts, call: cst.Call) -> list[cst.BaseExpression]:
    """The device index expressions ``call`` chooses a CUDA device with: ``torch.cuda.set_device(i)``,
    ``torch.device("cuda", i)`` (or ``torch.device(i)``), ``init_process_group(device_id=i)``,
    ``DDP(m, device_ids=[i], output_device=i)``, ``x.to(i)``, ``x.cuda(i)`` and ``"cuda:{}".format(i)``."""
    func = call.func
    name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
    found: list[cst.BaseExpression | None] = []
    if name in {"to", "cuda"} and isinstance(func, cst.Attribute):
        found.append(argument_of(call, "device", 0))
    elif name == "format" and isinstance(func, cst.Attribute) and cuda_prefix(func.value):
        found.append(argument_of(call, "", 0))
    elif name in {"set_device", "device", "set_device_index"} and facts.callee_is(call, SET_DEVICE):
        found.append(argument_of(call, "device", 0))
    elif name == "device" and facts.callee_is(call, TORCH_DEVICE):
        kind, index = argument_of(call, "type", 0), argument_of(call, "index", 1)
        if index is not None and string_value(kind) == "cuda":
            found.append(index)
        elif index is None and string_value(kind) is None:
            found.append(kind)  # `torch.device(rank)`: an integer is a CUDA index
    elif name == "init_process_group" and facts.callee_is(call, INIT_PROCESS_GROUP):
        found.append(argument_of(call, "device_id", 8))  # torch 2.13: `device_id: torch.device | int | None`
    elif len(call.args) >= 2 and facts.callee_is(call, DDP_WRAPPERS):  # `DDP(model)` names no device
        ids = argument_of(call, "device_ids", 1)
        if isinstance(ids, (cst.List, cst.Tuple)):
            found.extend(e.value for e in ids.elements if not isinstance(e, cst.StarredElement))
        found.append(argument_of(call, "output_device", 2))
    return [index for index in found if index is not None]


# Device types indexed per process as CUDA is: CUDA, Intel XPU, Ascend NPU, Gaudi HPU, Cambricon MLU.
INDEXED_DEVICE_PREFIXES = ("cuda:", "xpu:", "npu:", "hpu:", "mlu:")


def cuda_prefix(expr: cst.BaseExpression) -> bool:
    """Whether ``expr`` is a string literal that starts with ``cuda:`` (or another indexed device type, ``xpu:``)."""
    value = string_value(expr)
    return value is not None and value.startswith(INDEXED_DEVICE_PREFIXES)


def string_device_index(node: cst.CSTNode) -> cst.BaseExpression | None:
    """The index a device string is built with: ``r`` of ``f"cuda:{r}"``, ``"cuda:%d" % r``, ``"cuda:" + str(r)``."""
    if isinstance(node, cst.BinaryOperation):
        if isinstance(node.operator, (cst.Modulo, cst.Add)) and cuda_prefix(node.left):
            right = node.right
            if isinstance(right, cst.Tuple) and len(right.elements) == 1:
                right = right.elements[0].value
            return right
        return None
    if not isinstance(node, cst.FormattedString):
        return None
    for before, after in itertools.pairwise(node.parts):
        if (
            isinstance(before, cst.FormattedStringText)
            and before.value.endswith(INDEXED_DEVICE_PREFIXES)
            and isinstance(after, cst.FormattedStringExpression)
        ):
            return after.expression
    return None


def current_device(facts: PythonFacts, call: cst.Call) -> bool:
    """Whether ``call`` takes the current CUDA device without an index: ``x.cuda()``, ``x.to("cuda")``,
    ``torch.device("cuda")``."""
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


def starts_nccl_group(facts: PythonFacts, call: cst.Call) -> bool:
    """Whether ``call`` is an ``init_process_group`` that may start an NCCL group of several processes: its
    backend is NCCL or left to the default, and its ``world_size`` is not a literal 1."""
    if not facts.callee_is(call, INIT_PROCESS_GROUP):
        return False
    size = argument_of(call, "world_size", 4)
    if isinstance(size, cst.Integer) and size.evaluated_value == 1:
        return False  # one process (a test's group): it owns GPU 0
    backend = argument_of(call, "backend", 0)
    if backend is None:
        return True  # the default: NCCL for CUDA tensors
    for origin in facts.origins(backend, call):
        value = string_value(origin.node) if isinstance(origin.node, cst.BaseExpression) else None
        if value is not None and "nccl" in value.lower():
            return True
    return False


def uses_cuda(facts: PythonFacts) -> bool:
    """This module puts work on CUDA devices itself: an NCCL process group (or the default backend), a CUDA
    index (``set_device(i)``, ``.cuda(i)``, ``device_ids=[i]``, ``torch.device("cuda", i)``, ``.to(local_rank)``,
    ``.to(f"cuda:{i}")``), or the current device (``.cuda()``, ``.to("cuda")``, ``torch.device("cuda")``); not
    ``.to(device)`` of a device lintdist does not know."""
    return any(
        starts_nccl_group(facts, call) or current_device(facts, call) or _cuda_index(facts, call)
        for call in facts.calls
    )


def _cuda_index(facts: PythonFacts, call: cst.Call) -> bool:
    indices = device_indices(facts, call)
    if not indices or not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "to"):
        return bool(indices)
    index = indices[0]
    if cuda_prefix(index) or string_device_index(index) is not None:
        return True
    last = (get_full_name_for_node(index) or "").rsplit(".", 1)[-1]
    return last in RANK_NAMES | GPU_INDEX_NAMES


GPU_INDEX_NAMES = frozenset({"gpu", "gpu_id", "device_id", "local_gpu"})
