"""DDP communication hooks as accelerate and torch spell them: the members of accelerate's
``DDPCommunicationHookType`` (accelerate 1.15), torch's hook and wrapper functions and the member that makes
accelerate register each, and what a value handed as a hook is."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from lintdist.values import python_value

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts

HOOK_ENUM = "DDPCommunicationHookType"
HOOK_ENUM_NAMES = frozenset(
    f"{module}.{HOOK_ENUM}" for module in ("accelerate", "accelerate.utils", "accelerate.utils.dataclasses")
)
# `DDPCommunicationHookType` values -> member names
MEMBERS = {
    "no": "NO",
    "fp16": "FP16",
    "bf16": "BF16",
    "power_sgd": "POWER_SGD",
    "batched_power_sgd": "BATCHED_POWER_SGD",
}
WRAPPER_MEMBERS = frozenset({"NO", "FP16", "BF16"})  # the `comm_wrapper` Literal
_HOOKS = "torch.distributed.algorithms.ddp_comm_hooks"
# torch's own hook functions -> the member that makes accelerate register that same function
TORCH_HOOKS = {
    **{f"{_HOOKS}.{m}.fp16_compress_hook": "FP16" for m in ("default_hooks", "default")},
    **{f"{_HOOKS}.{m}.bf16_compress_hook": "BF16" for m in ("default_hooks", "default")},
    **{f"{_HOOKS}.{m}.powerSGD_hook": "POWER_SGD" for m in ("powerSGD_hook", "powerSGD")},
    **{f"{_HOOKS}.{m}.batched_powerSGD_hook": "BATCHED_POWER_SGD" for m in ("powerSGD_hook", "powerSGD")},
}
TORCH_WRAPPERS = {
    **{f"{_HOOKS}.{m}.fp16_compress_wrapper": "FP16" for m in ("default_hooks", "default")},
    **{f"{_HOOKS}.{m}.bf16_compress_wrapper": "BF16" for m in ("default_hooks", "default")},
}


def hook_value(
    facts: PythonFacts, value: cst.BaseExpression, at: cst.CSTNode, wrapper: bool = False
) -> tuple[str, str | None]:
    """What a value handed as a DDP communication hook (``wrapper``: as a hook wrapper) is, and the
    ``DDPCommunicationHookType`` member it stands for: ("enum", None) a member itself, ("string", member or None)
    a string, ("torch", member) one of torch's functions, ("local", None) a function of this file, or ("unknown",
    None)."""
    table = TORCH_WRAPPERS if wrapper else TORCH_HOOKS
    names = facts.qualified_names(value) if isinstance(value, (cst.Name, cst.Attribute)) else frozenset()
    if any(name.rsplit(".", 1)[0] in HOOK_ENUM_NAMES for name in names):
        return "enum", None
    found = next((table[name] for name in names if name in table), None)
    if found is not None:
        return "torch", found
    if isinstance(value, cst.Name) and facts.functions.get(value.value) and not facts.bindings(value.value, at):
        return "local", None  # a `def` of this file
    origins = facts.origins(value, at)
    if len(origins) != 1 or origins[0].index is not None:
        return "unknown", None
    node = origins[0].node
    if isinstance(node, cst.SimpleString):
        member = MEMBERS.get(python_value(node).lower())
        return "string", None if wrapper and member not in WRAPPER_MEMBERS else member
    if isinstance(node, (cst.Name, cst.Attribute)) and node is not value:
        return hook_value(facts, node, at, wrapper)
    if isinstance(node, (cst.FunctionDef, cst.Lambda)):
        return "local", None
    return "unknown", None
