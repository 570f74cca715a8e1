"""LD303 localsgd-unsupported-backend: LocalSGD built where accelerate runs DeepSpeed, FSDP, XLA or Megatron-LM."""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst

from lintdist.backends import accelerators_behind
from lintdist.facts import argument_of
from lintdist.guards import guarded_by
from lintdist.launch import LaunchSettings, written
from lintdist.literals import is_name
from lintdist.loop import DEEPSPEED_PLUGINS, FSDP_PLUGINS
from lintdist.model import Severity
from lintdist.rule import Invalid, Rule, Valid

LOCAL_SGD = frozenset({"accelerate.local_sgd.LocalSGD"})


MEGATRON_PLUGINS = frozenset({"accelerate.utils.MegatronLMPlugin", "accelerate.utils.dataclasses.MegatronLMPlugin"})
# Accelerator keyword -> (the distributed type it selects, the plugin classes that may fill it)
PLUGIN_KEYWORDS = {
    "deepspeed_plugin": ("DEEPSPEED", DEEPSPEED_PLUGINS),
    "deepspeed_plugins": ("DEEPSPEED", DEEPSPEED_PLUGINS),
    "fsdp_plugin": ("FSDP", FSDP_PLUGINS),
    "megatron_lm_plugin": ("MEGATRON_LM", MEGATRON_PLUGINS),
}
# The distributed types LocalSGD.__init__ rejects (accelerate/local_sgd.py), with how the message names them.
UNSUPPORTED = {"DEEPSPEED": "DeepSpeed", "FSDP": "FSDP", "XLA": "XLA (TPU)", "MEGATRON_LM": "Megatron-LM"}
# How a launch file spells each backend, for the message.
# A condition mentioning one of these decides by backend: the code under it may never run under the one in force.
# (`isinstance(model, DistributedDataParallel)` holds only under plain DDP.)
BACKEND_WORDS = re.compile(
    r"distributed_?type|deepspeed|fsdp|fully_?shard|xla|tpu|megatron|multi_?gpu|multi_?cpu|ddp|distributeddataparallel",
    re.IGNORECASE,
)
MAX_CALLER_DEPTH = 3


@dataclass(frozen=True)
class Evidence:
    backend: str  # a key of UNSUPPORTED
    where: str  # what selected it and where, for the message


class LocalSgdUnsupportedBackend(Rule):
    """
    ## What it does
    Reports a `LocalSGD(...)` construction in a script whose backend is
    DeepSpeed, FSDP, XLA or Megatron-LM: from a plugin given to the
    `Accelerator` (`deepspeed_plugin=`, `fsdp_plugin=`, `megatron_lm_plugin=`),
    from the accelerate config the script is launched with
    (`distributed_type: DEEPSPEED`), or from the launch line (`--use_deepspeed`,
    `--use_fsdp`, `--tpu`, `ACCELERATE_USE_DEEPSPEED=true`). The report points
    at the `LocalSGD(` call and names the file and line that chose the backend.

    ## Why is this bad?
    `LocalSGD.__init__` checks `accelerator.distributed_type` before anything
    else and raises `NotImplementedError` for every type other than no
    distribution and the plain multi-device DDP types (`MULTI_CPU`,
    `MULTI_GPU`, `MULTI_XPU`, ...). It raises even with `enabled=False`, so the
    run crashes as soon as the `with LocalSGD(...)` line is reached. LocalSGD
    relies on DDP's `no_sync()` and on averaging whole parameters, which
    sharded or engine-managed models do not offer.

    The backend is taken from, in this order: a plugin built in the script,
    the launch line's flags, its environment variables, and the accelerate
    config (the one named by `--config_file`, the `accelerate-config` setting
    of lintdist, or the only accelerate config beside the script when it is
    the folder's one entry point). Nothing is
    reported when the call sits under a condition about the backend
    (`if accelerator.distributed_type == DistributedType.MULTI_GPU:`,
    `if not args.deepspeed:`), after an early exit on such a condition, when
    the launch line overrides a config's backend with `--multi_gpu`, or when
    the `Accelerator` (or the launch) asks for the CPU, since then neither
    DeepSpeed nor FSDP is switched on.

    ## Example
    ```python
    from accelerate import Accelerator, DeepSpeedPlugin
    from accelerate.local_sgd import LocalSGD

    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=8) as local_sgd:
        for batch in loader:
            ...
            local_sgd.step()
    ```

    ## Use instead
    ```python
    from accelerate import Accelerator
    from accelerate.local_sgd import LocalSGD

    accelerator = Accelerator()  # launched as plain DDP: distributed_type MULTI_GPU
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=8) as local_sgd:
        for batch in loader:
            ...
            local_sgd.step()
    ```
    To keep DeepSpeed or FSDP, drop LocalSGD and communicate less often with
    the backend's own gradient accumulation (`gradient_accumulation_steps`).

    ## Fix safety
    No fix: choosing between DDP and the sharded backend is a decision about
    memory and speed that only the author can make.

    ## References
    - accelerate `accelerate/local_sgd.py`, `LocalSGD.__init__` (the distributed
      type check and its `NotImplementedError`)
    - accelerate `accelerate/state.py`, `AcceleratorState.__init__` (how plugins
      and `ACCELERATE_USE_*` select the distributed type)
    - accelerate `accelerate/commands/launch.py`, `_validate_launch_command`
      (launch flags take precedence over the config's `distributed_type`)
    """

    code = "LD303"
    name = "localsgd-unsupported-backend"
    severity = Severity.ERROR
    fix_kind = "none"
    triggers = ("LocalSGD",)

    VALID = (
        Valid(
            """\
from accelerate import Accelerator
from accelerate.local_sgd import LocalSGD

accelerator = Accelerator()
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=8) as local_sgd:
    for batch in loader:
        accelerator.backward(model(batch).sum())
        optimizer.step()
        local_sgd.step()
"""
        ),
        Valid(
            """\
from accelerate import Accelerator, DeepSpeedPlugin, DistributedType
from accelerate.local_sgd import LocalSGD

accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
if accelerator.distributed_type == DistributedType.MULTI_GPU:
    local_sgd = LocalSGD(accelerator, model, 8)
"""
        ),
        Valid(
            """\
from accelerate import Accelerator, DeepSpeedPlugin
from accelerate.local_sgd import LocalSGD

plugin = DeepSpeedPlugin(zero_stage=2) if args.deepspeed else None
accelerator = Accelerator(deepspeed_plugin=plugin)
local_sgd = LocalSGD(accelerator, model, 8)
"""
        ),
        Valid(
            """\
from accelerate import Accelerator, FullyShardedDataParallelPlugin
from accelerate.local_sgd import LocalSGD

def train(accelerator, model):
    if accelerator.state.fsdp_plugin is not None:
        raise SystemExit("LocalSGD needs DDP")
    with LocalSGD(accelerator, model, 4) as local_sgd:
        local_sgd.step()

accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())
train(accelerator, model)
"""
        ),
        Valid(
            """\
from accelerate import Accelerator, DeepSpeedPlugin
from accelerate.local_sgd import LocalSGD

accelerator = Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
local_sgd = LocalSGD(accelerator, model, 8)
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
from accelerate import Accelerator, DeepSpeedPlugin
from accelerate.local_sgd import LocalSGD

accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=8, enabled=False) as local_sgd:
    for batch in loader:
        accelerator.backward(model(batch).sum())
        local_sgd.step()
""",
            lines=(6,),
        ),
        Invalid(
            """\
import accelerate
import accelerate.local_sgd as lsgd
from accelerate.utils import FullyShardedDataParallelPlugin as FSDPPlugin


def build(model):
    fsdp = FSDPPlugin(fsdp_version=2)
    accelerator = accelerate.Accelerator(fsdp_plugin=fsdp)
    return accelerator, accelerator.prepare(model)


accelerator, model = build(model)
if args.local_sgd_steps:
    sync = lsgd.LocalSGD(accelerator, model, args.local_sgd_steps)
""",
            lines=(14,),
        ),
    )

    def finish(self) -> None:
        facts = self.facts
        for call in facts.calls:
            if not facts.callee_is(call, LOCAL_SGD) or self._guarded(call):
                continue
            accelerators = self._accelerators(call)
            if any(is_name(argument_of(acc, "cpu", None), "True") for acc in accelerators):
                continue  # `Accelerator(cpu=True)`: accelerate then switches neither DeepSpeed nor FSDP on
            evidence = self._code_evidence(accelerators) or _launch_evidence(self.context.settings)
            if evidence is not None:
                self.report(call, _message(evidence))

    def _guarded(self, node: cst.CSTNode) -> bool:
        """``node`` runs only under a condition about the backend, or after an early exit on one."""
        return guarded_by(self.facts, node, BACKEND_WORDS, lambda n: self.context.span(n).line, MAX_CALLER_DEPTH)

    # -- which Accelerator, and what the code gives it ---------------------------------------

    def _accelerators(self, call: cst.Call) -> list[cst.Call]:
        """The ``Accelerator(...)`` calls behind LocalSGD's first argument; the file's only one if that is unknown."""
        argument = argument_of(call, "accelerator", 0)
        if argument is None:
            everywhere = self.facts.accelerator_constructions
            return everywhere if len(everywhere) == 1 else []
        return [a for a in accelerators_behind(self.facts, argument, call) if a is not None]

    def _code_evidence(self, accelerators: list[cst.Call]) -> Evidence | None:
        """A plugin that every ``Accelerator`` LocalSGD can receive is given; None when one of them has none
        (``Accelerator(deepspeed_plugin=p)`` in one branch, ``Accelerator()`` in the other)."""
        found = [self._plugin_evidence(accelerator) for accelerator in accelerators]
        return found[0] if found and all(found) else None

    def _plugin_evidence(self, accelerator: cst.Call) -> Evidence | None:
        for keyword, (backend, classes) in PLUGIN_KEYWORDS.items():
            value = argument_of(accelerator, keyword, None)
            if value is not None and self._always_plugin(value, accelerator, classes):
                line = self.context.span(accelerator).line
                return Evidence(backend, f"the `Accelerator` at line {line} is given `{keyword}=`")
        return None

    def _always_plugin(self, value: cst.BaseExpression, at: cst.CSTNode, classes: frozenset[str]) -> bool:
        """Every value the keyword can receive is a plugin built here (never None, never unknown)."""
        facts = self.facts
        origins = facts.origins(value, at)
        if not origins:
            return False
        for origin in origins:
            node = origin.node
            if origin.index is not None:
                return False
            if isinstance(node, cst.Dict) and node.elements:  # deepspeed_plugins={"name": DeepSpeedPlugin(...)}
                if not all(
                    isinstance(e, cst.DictElement) and self._always_plugin(e.value, node, classes)
                    for e in node.elements
                ):
                    return False
            elif not (isinstance(node, cst.Call) and facts.callee_is(node, classes)):
                return False
        return True


def _launch_evidence(settings: LaunchSettings | None) -> Evidence | None:
    """The backend the launch selects, unless the launch line or config also puts the run on the CPU."""
    chosen = settings.backend if settings is not None else None
    if chosen is None or str(chosen.value).upper() not in UNSUPPORTED:
        return None
    return Evidence(str(chosen.value).upper(), written(chosen))


def _message(evidence: Evidence) -> str:
    return (
        f"`LocalSGD` raises NotImplementedError under {UNSUPPORTED[evidence.backend]} ({evidence.where}), "
        "even with `enabled=False`; run LocalSGD under plain DDP (`distributed_type: MULTI_GPU`), or drop it "
        "and synchronize less often with gradient accumulation (`gradient_accumulation_steps`)"
    )
