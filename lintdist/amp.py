"""torch's mixed-precision API by name: the deprecated ``torch.cuda.amp``/``torch.cpu.amp`` spellings of autocast,
GradScaler and custom_fwd/bwd (torch 2.13 `torch/cuda/amp/autocast_mode.py`, `grad_scaler.py`, `torch/cpu/amp/*.py`:
each carries ``@deprecated(..., category=FutureWarning)``), their ``torch.amp`` replacements (same names) and the
first torch release with each replacement."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
from libcst.helpers import get_full_name_for_node

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts

# What `torch.amp` exports under the old names (torch 2.13 `torch/amp/__init__.py`).
KINDS = ("autocast", "GradScaler", "custom_fwd", "custom_bwd")
# The deprecated classes and functions by qualified name -> (kind, device type).
DEPRECATED: dict[str, tuple[str, str]] = {
    f"torch.{device}.amp.{path}": (path.rsplit(".", 1)[-1], device)
    for device in ("cuda", "cpu")
    for path in ("autocast", "autocast_mode.autocast", "GradScaler", "grad_scaler.GradScaler")
} | {f"torch.cuda.amp.{path}{kind}": (kind, "cuda") for kind in KINDS[2:] for path in ("", "autocast_mode.")}
OLD_MODULES = {"torch.cuda.amp": "cuda", "torch.cpu.amp": "cpu"}
# The replacements, and the other spellings of them (`torch.autocast`, `torch.GradScaler`).
NEW_NAMES = frozenset(
    {
        "torch.amp.autocast",
        "torch.amp.autocast_mode.autocast",
        "torch.autocast",
        "torch.amp.GradScaler",
        "torch.amp.grad_scaler.GradScaler",
        "torch.GradScaler",
        "torch.amp.custom_fwd",
        "torch.amp.custom_bwd",
        "torch.amp.autocast_mode.custom_fwd",
        "torch.amp.autocast_mode.custom_bwd",
    }
)
# The first torch release with each replacement: `torch.amp.autocast(device_type, ...)` 1.10,
# `torch.amp.GradScaler(device, ...)` 2.3, `torch.amp.custom_fwd/custom_bwd(..., device_type=)` 2.4.
SINCE = {"autocast": "1.10", "GradScaler": "2.3", "custom_fwd": "2.4", "custom_bwd": "2.4"}


def deprecated_amp(facts: PythonFacts, callee: cst.BaseExpression) -> tuple[str, str] | None:
    """(kind, device type) when ``callee`` names a deprecated amp API (``("GradScaler", "cuda")`` for
    ``torch.cuda.amp.GradScaler``, any import spelling); None otherwise, and for a name bound to the old or the new
    API depending on the torch version."""
    if isinstance(callee, cst.Attribute) and callee.attr.value not in KINDS:
        return None
    if isinstance(callee, cst.Name) and callee.value not in KINDS and callee.value not in facts.imported_names:
        return None
    names = facts.qualified_names(callee)
    found = names & DEPRECATED.keys()
    if not found or names & NEW_NAMES:
        return None
    return DEPRECATED[min(found)]


def torch_amp_import(statement: cst.Import | cst.ImportFrom) -> tuple[cst.CSTNode, bool] | None:
    """The import that binds the same names from ``torch.amp`` in place of a deprecated amp module
    (``from torch.cuda.amp import autocast``, ``from torch.cuda import amp``, ``import torch.cuda.amp as amp``), and
    whether the name it binds is the module (read through attributes); None for any other import."""
    if isinstance(statement, cst.ImportFrom):
        if statement.relative or statement.module is None:
            return None
        module = get_full_name_for_node(statement.module)
        names = [get_full_name_for_node(a.name) for a in statement.names]
        submodules = {f"{m}.{sub}" for m in OLD_MODULES for sub in ("autocast_mode", "grad_scaler")}
        if module in OLD_MODULES or module in submodules:
            if not all(name in KINDS for name in names):
                return None
            return statement.with_changes(module=cst.parse_expression("torch.amp")), False
        if module in ("torch.cuda", "torch.cpu") and names == ["amp"]:
            return statement.with_changes(module=cst.Name("torch")), True
        return None
    if len(statement.names) != 1 or statement.names[0].asname is None:
        return None
    alias = statement.names[0]
    if get_full_name_for_node(alias.name) not in OLD_MODULES:
        return None
    return statement.with_changes(names=[alias.with_changes(name=cst.parse_expression("torch.amp"))]), True
