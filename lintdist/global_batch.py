"""How the global batch grows with the number of processes: each process loads its own batch through
accelerate's ``prepare`` (unless the Accelerator splits batches), or each rank samples its own batch with a
``DistributedSampler`` beside a DDP/FSDP model."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import ACCELERATOR_CLASSES, DATALOADER_CLASSES, SAMPLER_CLASSES, argument_of

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts


def batch_grows_with_processes(facts: PythonFacts) -> str | None:
    """How the global batch grows with the processes: "accelerate" (a loader goes through ``prepare`` without
    ``split_batches``) or "ddp" (a ``DistributedSampler`` beside a DDP/FSDP model); None otherwise."""
    prepares = [c for c in facts.calls if facts.is_prepare_call(c) and facts.method_name(c) == "prepare"]
    for call in prepares:
        for arg in call.args:
            if arg.keyword is not None or arg.star:
                continue
            named = "loader" in (get_full_name_for_node(arg.value) or "").rsplit(".", 1)[-1].lower()
            built = any(
                isinstance(o.node, cst.Call) and facts.is_instance_of(o.node, DATALOADER_CLASSES, "DataLoader")
                for o in facts.origins(arg.value, call)
            )
            if (named or built) and not splits_batches(facts, call):
                return "accelerate"
    if facts.wrapped_models() and any(
        facts.is_instance_of(c, SAMPLER_CLASSES, "DistributedSampler") for c in facts.calls
    ):
        return "ddp"
    return None


def splits_batches(facts: PythonFacts, prepare: cst.Call) -> bool:
    """The Accelerator behind ``prepare`` may split batches: ``dataloader_config`` gives ``split_batches`` a value
    other than ``False`` or is not a call lintdist reads, or ``*args``/``**kwargs`` may say so. A configuration
    call's own ``**kwargs`` is read as not splitting."""
    if not isinstance(prepare.func, cst.Attribute):
        return False
    for origin in facts.origins(prepare.func.value, prepare):
        accelerator = origin.node
        if not isinstance(accelerator, cst.Call) or not facts.callee_is(accelerator, ACCELERATOR_CLASSES):
            continue
        if any(arg.star for arg in accelerator.args):
            return True
        config = argument_of(accelerator, "dataloader_config", None)
        if config is None:
            continue
        for inner in facts.origins(config, accelerator):
            node = inner.node
            if not isinstance(node, cst.Call):
                return True
            split = argument_of(node, "split_batches", 0)
            if split is not None and not (isinstance(split, cst.Name) and split.value == "False"):
                return True
    return False
