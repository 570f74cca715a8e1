"""LD303 localsgd-unsupported-backend: LocalSGD built where accelerate runs DeepSpeed, FSDP, XLA or Megatron-LM."""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import ACCELERATOR_CLASSES, argument_of
from lintdist.launch import LaunchSettings, written
from lintdist.model import Severity
from lintdist.rule import Invalid, Rule, Valid

LOCAL_SGD = frozenset({"accelerate.local_sgd.LocalSGD"})


def _class_names(name: str, *modules: str) -> frozenset[str]:
    return frozenset(f"{module}.{name}" for module in modules)


DEEPSPEED_PLUGINS = _class_names("DeepSpeedPlugin", "accelerate", "accelerate.utils", "accelerate.utils.dataclasses")
FSDP_PLUGINS = _class_names(
    "FullyShardedDataParallelPlugin", "accelerate", "accelerate.utils", "accelerate.utils.dataclasses"
)
MEGATRON_PLUGINS = _class_names("MegatronLMPlugin", "accelerate.utils", "accelerate.utils.dataclasses")
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
MAX_NAME_DEPTH = 3  # how many `a = ...; b = a and ...` steps a condition is followed back


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

    def __init__(self, context) -> None:
        super().__init__(context)
        self._ifs: list[cst.If] = []
        self._asserts: list[cst.Assert] = []

    def finish(self) -> None:
        facts = self.facts
        self._ifs = facts.index.nodes(cst.If)
        self._asserts = facts.index.nodes(cst.Assert)
        for call in facts.calls:
            if not facts.callee_is(call, LOCAL_SGD) or self._guarded(call, 0):
                continue
            accelerators = self._accelerators(call)
            if any(_asks_for_cpu(acc) for acc in accelerators):
                continue
            evidence = self._code_evidence(accelerators) or _launch_evidence(self.context.settings)
            if evidence is not None:
                self.report(call, _message(evidence))

    # -- which Accelerator, and what the code gives it ---------------------------------------

    def _accelerators(self, call: cst.Call) -> list[cst.Call]:
        """The ``Accelerator(...)`` calls behind LocalSGD's first argument; the file's only one if that is unknown."""
        facts = self.facts
        everywhere = [c for c in facts.calls if facts.callee_is(c, ACCELERATOR_CLASSES)]
        argument = argument_of(call, "accelerator", 0)
        if argument is not None:
            found = [
                o.node
                for o in facts.origins(argument, call)
                if isinstance(o.node, cst.Call) and o.index is None and facts.callee_is(o.node, ACCELERATOR_CLASSES)
            ]
            if found:
                return found
        return everywhere if len(everywhere) == 1 else []

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

    # -- conditions that decide by backend --------------------------------------------------

    def _guarded(self, node: cst.CSTNode, depth: int) -> bool:
        """``node`` runs only under a condition about the backend, or after an early exit on one."""
        facts = self.facts
        child = node
        for ancestor in facts.ancestors(node):
            conditional = isinstance(ancestor, (cst.If, cst.While, cst.IfExp))
            if conditional and child is not ancestor.test and self._mentions_backend(ancestor.test):
                return True
            child = ancestor
        function = facts.enclosing_function(node)
        line = self.context.span(node).line

        def before(other: cst.CSTNode) -> bool:
            return (
                facts.enclosing_function(other) is function
                and self.context.span(other).line < line
                and not facts.is_within(node, other)
            )

        if any(before(branch) and self._exits_on_backend(branch, returns=True) for branch in self._ifs):
            return True
        if any(before(check) and self._mentions_backend(check.test) for check in self._asserts):
            return True
        # `ensure_ddp(accelerator)` first: a helper that raises on the wrong backend
        for call in facts.calls:
            if (
                before(call)
                and isinstance(facts.parent(call), cst.Expr)
                and any(self._checks_backend(helper) for helper in facts.local_functions(call))
            ):
                return True
        if function is None or depth >= MAX_CALLER_DEPTH:
            return False
        sites = facts.call_sites(function)
        return bool(sites) and all(self._guarded(site, depth + 1) for site in sites)

    def _exits_on_backend(self, branch: cst.If, returns: bool) -> bool:
        return self._mentions_backend(branch.test) and _exits(branch.body, returns)

    def _checks_backend(self, helper: cst.FunctionDef) -> bool:
        """The helper stops the run on a backend condition (``raise`` under an ``if``, or an ``assert``);
        a ``return`` only leaves the helper."""
        facts = self.facts
        return any(
            facts.enclosing_function(branch) is helper and self._exits_on_backend(branch, returns=False)
            for branch in self._ifs
        ) or any(
            facts.enclosing_function(check) is helper and self._mentions_backend(check.test) for check in self._asserts
        )

    def _mentions_backend(self, test: cst.BaseExpression, depth: int = 0) -> bool:
        """The condition names the backend, directly or through names bound to such an expression
        (``use_local_sgd = accelerator.distributed_type == DistributedType.MULTI_GPU``)."""
        if any(BACKEND_WORDS.search(word) for word in _words(self.facts, test)):
            return True
        if depth >= MAX_NAME_DEPTH:
            return False
        names = [test] if isinstance(test, cst.Name) else _names_in(self.facts, test)
        return any(
            self._mentions_backend(binding.value, depth + 1)
            for name in names
            for binding in self.facts.bindings(name.value, test)
        )


def _names_in(facts, expr: cst.BaseExpression) -> list[cst.Name]:
    """The names in ``expr`` outside any attribute: `args.deepspeed` is judged by its words, not followed."""
    inside = {id(name) for attribute in facts.within(expr, cst.Attribute) for name in facts.within(attribute, cst.Name)}
    return [name for name in facts.within(expr, cst.Name) if id(name) not in inside]


def _launch_evidence(settings: LaunchSettings | None) -> Evidence | None:
    """The backend the launch selects, unless the launch line or config also puts the run on the CPU."""
    chosen = settings.backend if settings is not None else None
    if chosen is None or str(chosen.value).upper() not in UNSUPPORTED:
        return None
    return Evidence(str(chosen.value).upper(), written(chosen))


def _asks_for_cpu(accelerator: cst.Call) -> bool:
    """``Accelerator(cpu=True)``: accelerate then switches neither DeepSpeed nor FSDP on."""
    value = argument_of(accelerator, "cpu", None)
    return isinstance(value, cst.Name) and value.value == "True"


def _words(facts, expr: cst.CSTNode) -> list[str]:
    """The names, attribute names and strings in an expression."""
    return [node.value for node in facts.within(expr, cst.Name, cst.SimpleString)]


def _exits(body: cst.BaseSuite, returns: bool = True) -> bool:
    """The block ends the function (when ``returns``) or the run: ``raise``, ``return``, ``sys.exit(...)``."""
    statements = body.body if isinstance(body, cst.IndentedBlock) else [body]
    for statement in statements:
        smalls = statement.body if isinstance(statement, (cst.SimpleStatementLine, cst.SimpleStatementSuite)) else ()
        for small in smalls:
            if isinstance(small, cst.Raise) or (returns and isinstance(small, cst.Return)):
                return True
            if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
                name = get_full_name_for_node(small.value.func) or ""
                if name in {"sys.exit", "exit", "quit", "os._exit"}:
                    return True
    return False


def _message(evidence: Evidence) -> str:
    return (
        f"`LocalSGD` raises NotImplementedError under {UNSUPPORTED[evidence.backend]} ({evidence.where}), "
        "even with `enabled=False`; run LocalSGD under plain DDP (`distributed_type: MULTI_GPU`), or drop it "
        "and synchronize less often with gradient accumulation (`gradient_accumulation_steps`)"
    )
