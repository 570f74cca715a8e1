"""What says that a script's model is sharded (FSDP or DeepSpeed): its launch settings, a plugin built in it, a test
of ``DistributedType.FSDP``, and accelerate settings that make a save wait for every rank.

Rules that say "hangs under FSDP" ask these instead of reading launch settings and plugin names themselves. The
answers come from the facts' indexes (no walk of their own) and are kept per file.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import ACCELERATOR_CLASSES, argument_of
from lintdist.loop import DEEPSPEED_PLUGINS, FSDP_PLUGINS

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts
    from lintdist.launch import LaunchSettings

SHARDED_BACKENDS = frozenset({"FSDP", "DEEPSPEED"})
PROJECT_CONFIGURATIONS = frozenset(
    {"accelerate.utils.ProjectConfiguration", "accelerate.utils.dataclasses.ProjectConfiguration"}
)


def launch_backend(settings: LaunchSettings | None) -> str | None:
    """The backend a launch's settings select, upper case ("FSDP", "DEEPSPEED", "MULTI_GPU"...), or None."""
    backend = settings.distributed_type if settings is not None else None
    return str(backend.value).upper() if backend is not None else None


def builds_fsdp_plugin(facts: PythonFacts) -> bool:
    """The script builds an accelerate FSDP plugin or passes ``fsdp_plugin=`` to an ``Accelerator``."""
    return _builds(facts, FSDP_PLUGINS, ("fsdp_plugin",))


def sharded(facts: PythonFacts, settings: LaunchSettings | None) -> bool:
    """The launch selects FSDP or DeepSpeed, or the script builds an FSDP or DeepSpeed plugin (or passes one to its
    ``Accelerator``)."""
    return launch_backend(settings) in SHARDED_BACKENDS or _builds(
        facts, FSDP_PLUGINS | DEEPSPEED_PLUGINS, ("fsdp_plugin", "deepspeed_plugin")
    )


def fsdp_evidence(
    facts: PythonFacts, settings: LaunchSettings | None, line_of: Callable[[cst.CSTNode], int]
) -> str | None:
    """What says the script runs under FSDP, in words: the launch settings, an FSDP plugin built in it, or a test of
    ``DistributedType.FSDP`` (it expects to run under FSDP), at the line ``line_of`` gives; None when nothing does."""
    if launch_backend(settings) == "FSDP":
        return "the launch settings select FSDP"
    if builds_fsdp_plugin(facts):
        return "the script builds an FSDP plugin"
    for node in facts.index.nodes(cst.Attribute):
        if node.attr.value == "FSDP" and any(q.endswith("DistributedType.FSDP") for q in facts.qualified_names(node)):
            return f"the script tests `DistributedType.FSDP` at line {line_of(node)}"
    return None


def automatic_checkpoint_naming(facts: PythonFacts) -> bool:
    """The script builds a ``ProjectConfiguration`` with ``automatic_checkpoint_naming`` set (not ``False``):
    accelerate 1.15's ``save_state`` then calls ``wait_for_everyone()`` whatever the backend."""
    if "automatic_checkpoint_naming" not in facts._memo:
        facts._memo["automatic_checkpoint_naming"] = any(
            facts.callee_is(call, PROJECT_CONFIGURATIONS)
            and (naming := argument_of(call, "automatic_checkpoint_naming", None)) is not None
            and get_full_name_for_node(naming) != "False"
            for call in facts.calls
        )
    return facts._memo["automatic_checkpoint_naming"]


def _builds(facts: PythonFacts, plugins: frozenset[str], keywords: tuple[str, ...]) -> bool:
    """The script builds one of ``plugins``, or passes one of ``keywords`` to an ``Accelerator``."""
    memo = facts._memo.setdefault("builds", {})
    if (plugins, keywords) not in memo:
        memo[plugins, keywords] = _scan_builds(facts, plugins, keywords)
    return memo[plugins, keywords]


def _scan_builds(facts: PythonFacts, plugins: frozenset[str], keywords: tuple[str, ...]) -> bool:
    return any(
        facts.callee_is(call, plugins)
        or (
            facts.callee_is(call, ACCELERATOR_CLASSES) and any(argument_of(call, k, None) is not None for k in keywords)
        )
        for call in facts.calls
    )


DEEPSPEED_PLACEHOLDERS = frozenset(
    f"accelerate.utils{module}.{name}" for module in ("", ".deepspeed") for name in ("DummyOptim", "DummyScheduler")
)


def builds_deepspeed_placeholders(facts: PythonFacts) -> bool:
    """The script builds accelerate's ``DummyOptim``/``DummyScheduler``, the placeholders for an optimizer and a
    scheduler a DeepSpeed config defines: it runs under DeepSpeed."""
    if "deepspeed placeholders" not in facts._memo:
        facts._memo["deepspeed placeholders"] = any(
            facts.method_name(call) in {"DummyOptim", "DummyScheduler"}
            and facts.callee_is(call, DEEPSPEED_PLACEHOLDERS)
            for call in facts.calls
        )
    return facts._memo["deepspeed placeholders"]


def needs_every_rank(facts: PythonFacts, settings: LaunchSettings | None, kind: str, method: str | None) -> bool:
    """Whether a collective of ``kind`` (``collectives.collective_kind``) needs every rank under what this project
    selects: an "always" one does; a "sharded" one (an Accelerator's ``method``) where the launch or the script
    selects FSDP or DeepSpeed, or, for ``save_state``, where automatic checkpoint naming makes it call
    ``wait_for_everyone()`` under any backend."""
    if kind != "sharded" or sharded(facts, settings):
        return True
    return method == "save_state" and automatic_checkpoint_naming(facts)


def hangs_under_main_or_deepspeed(
    facts: PythonFacts,
    settings: LaunchSettings | None,
    kind: str,
    method: str | None,
    line_of: Callable[[cst.CSTNode], int],
) -> bool:
    """Whether a collective of ``kind`` (an Accelerator's ``method`` when "sharded") hangs under ``if
    accelerator.is_main_process or <DeepSpeed>:`` in this project: never where the launch selects DeepSpeed (every
    rank enters); a plain collective under any other backend; a sharded one only where the project says FSDP
    (``fsdp_evidence``), or, for ``save_state``, where automatic checkpoint naming makes it wait for every rank."""
    backend = launch_backend(settings)
    if backend == "DEEPSPEED":
        return False
    if kind != "sharded":
        return True
    waits = method == "save_state" and automatic_checkpoint_naming(facts)
    if backend is not None and backend != "FSDP" and not waits:
        return False
    return fsdp_evidence(facts, settings, line_of) is not None or waits


TRAINING_ARGUMENTS = frozenset({"transformers.TrainingArguments", "transformers.Seq2SeqTrainingArguments"})


def parameter_sharding(facts: PythonFacts, settings: LaunchSettings | None) -> tuple[bool | None, str]:
    """Whether this script's model runs with its parameters sharded, so that every forward gathers them on every
    rank (FSDP, DeepSpeed ZeRO-3), and what says so: True (the launch or the script selects FSDP or ZeRO stage 3),
    False (they select a backend that keeps whole parameters: DDP, ZeRO stage 0-2), None (nothing says)."""
    from lintdist.deepspeed_settings import literal_zero_stage, zero_stage
    from lintdist.wrappers import module_wrapper_kinds

    backend = launch_backend(settings)
    if backend == "FSDP":
        return True, "the launch settings select FSDP"
    if builds_fsdp_plugin(facts):
        return True, "the script builds an FSDP plugin"
    if module_wrapper_kinds(facts) & {"fsdp1", "fsdp2"}:
        return True, "the script wraps the model with FSDP"
    for call in facts.calls:
        if not (facts.method_name(call) or "").endswith("TrainingArguments"):
            continue
        fsdp = argument_of(call, "fsdp", None)
        if (
            isinstance(fsdp, cst.SimpleString)
            and fsdp.evaluated_value.strip()
            and facts.callee_is(call, TRAINING_ARGUMENTS)
        ):
            return True, f"`TrainingArguments(fsdp={fsdp.value})` selects FSDP"
    uses_plugin = backend == "DEEPSPEED" or _builds(facts, DEEPSPEED_PLUGINS, ("deepspeed_plugin",))
    plugin_or_launch = zero_stage(facts, settings) if uses_plugin else None
    stage = plugin_or_launch if plugin_or_launch is not None else literal_zero_stage(facts)
    if stage is not None:
        return stage == 3, f"DeepSpeed runs with ZeRO stage {stage}"
    if backend is not None and backend != "DEEPSPEED":
        return False, f"the launch settings select {backend}"
    return None, ""


def gathered_for_generation(facts: PythonFacts, node: cst.CSTNode) -> bool:
    """``node`` runs inside ``with unwrap_model_for_generation(model, accelerator):`` (TRL's, or a copy of it), which
    under ZeRO-3 gathers the whole parameters and removes DeepSpeed's hooks for the block, so a forward there makes
    no collective; not with ``gather_deepspeed3_params=False``, which yields the sharded model."""
    for ancestor in facts.ancestors(node):
        if not isinstance(ancestor, cst.With):
            continue
        for item in ancestor.items:
            call = item.item
            if isinstance(call, cst.Call) and facts.method_name(call) == "unwrap_model_for_generation":
                gather = argument_of(
                    call, "gather_deepspeed3_params", None
                )  # by keyword: older TRL has is_peft_model third
                return gather is None or not (isinstance(gather, cst.Name) and gather.value == "False")
    return False
