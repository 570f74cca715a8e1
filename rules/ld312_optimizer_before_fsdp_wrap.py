"""LD312 optimizer-before-fsdp-wrap: an optimizer built from a model's parameters before torch FSDP wraps the
model, and used after: it steps tensors the wrapped model no longer computes with.

What torch 2.13 does, read in its source:

* ``distributed/fsdp/fully_sharded_data_parallel.py::FullyShardedDataParallel``: the class docstring says "Using
  FSDP involves wrapping your module and then initializing your optimizer after. This is required since FSDP
  changes the parameter variables"; ``use_orig_params`` defaults to ``False``.
* ``distributed/fsdp/_flat_param.py::FlatParamHandle``: ``flatten_tensors_into_flat_param`` copies the module's
  parameters into one new ``FlatParameter``, and ``_use_unsharded_views``/``_use_sharded_views`` replace them in
  their modules by plain tensor views of it (``_setattr_tensor``) unless ``use_orig_params=True``, which keeps the
  original ``nn.Parameter`` objects and points their data into the flat parameter.
* ``distributed/fsdp/_fully_shard/_fsdp_param.py::FSDPParam._init_sharded_param`` (FSDP2's ``fully_shard``): each
  parameter is replaced on its module by a new ``nn.Parameter`` holding a sharded DTensor (``_setattr_on_modules``).

accelerate's ``prepare`` is left out: accelerate up to 0.24 rebuilt an optimizer passed with the model
(``_prepare_fsdp``, removed in 0.25 by PR 2177), ``accelerate launch`` exports ``FSDP_USE_ORIG_PARAMS=true``
by default, and FSDP2 swaps the optimizer's parameters in ``_prepare_fsdp2``.
"""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.bindings import bound_names, read_names, rebinds_any
from lintdist.control import never_together, statement_of
from lintdist.facts import argument_of
from lintdist.model import Applicability, Fix, Severity
from lintdist.optimizers import optimizer_class
from lintdist.rule import Invalid, Rule, Valid
from lintdist.values import constant_truth, known_value
from lintdist.wrap_order import Wrap, wrapped_after

PARAMETER_METHODS = frozenset({"parameters", "named_parameters"})
WHAT_THE_WRAP_DOES = {
    "fsdp1": (
        "`FullyShardedDataParallel`",
        "with `use_orig_params=False` (torch's default) FSDP copies the parameters into one new flat parameter and "
        "replaces them in the modules by views of it",
        "or pass `use_orig_params=True`",
    ),
    "fsdp2": (
        "`fully_shard`",
        "`fully_shard` replaces every parameter on its module by a new parameter holding a sharded DTensor",
        "as torch's FSDP2 documentation does",
    ),
}


class Fsdp1OptimizerBeforeWrap(Rule):
    """
    ## What it does
    Reports a `torch.optim` optimizer built from `model.parameters()` (or
    `named_parameters()`, also inside parameter groups), or by nanoGPT's
    `model.configure_optimizers(...)`, when the same model
    is wrapped later in the same function (`model = model.to(device)` keeps
    it the same model) by torch's FSDP1
    `FullyShardedDataParallel(model, ...)` without `use_orig_params=True`, or
    sharded in place by FSDP2's `fully_shard(model)`, and the optimizer is
    still used after the wrap (not built again). A `use_orig_params` value
    lintdist cannot read is left alone.

    ## Why is this bad?
    The optimizer holds the parameter objects it was given. FSDP1 (with
    `use_orig_params=False`, torch's default) copies the module's parameters
    into one new flat parameter and replaces them in their modules by views of
    it; FSDP2's `fully_shard` replaces each parameter by a new sharded DTensor
    parameter. The forward then computes with the new tensors only, so the
    old ones the optimizer holds never get a gradient: `optimizer.step()`
    changes nothing, the loss does not move, and no error is raised. torch's
    FSDP documentation says to wrap first and build the optimizer after.

    ## Example
    ```python
    model = Net().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model = FullyShardedDataParallel(model, auto_wrap_policy=policy)
    ```

    ## Use instead
    ```python
    model = Net().to(device)
    model = FullyShardedDataParallel(model, auto_wrap_policy=policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ```

    ## Fix safety
    Unsafe, and offered only when the optimizer is built in one simple
    statement of the same block as the wrap, reads the model's parameters
    itself (not through groups gathered earlier), the wrap keeps the model's name
    (`model = FullyShardedDataParallel(model)`, `fully_shard(model)`), and no
    statement between them reads the optimizer or binds a name its
    construction reads: the fix moves the statement to just after the wrap.
    Its parameter groups then see the wrapped model's parameter names (FSDP1
    without `use_orig_params=True` has one flat parameter per wrapped unit, so
    per-parameter groups such as "no weight decay on biases" no longer apply),
    which changes what the optimizer does.

    ## References
    - torch 2.13 `distributed/fsdp/fully_sharded_data_parallel.py::FullyShardedDataParallel` (docstring:
      "wrapping your module and then initializing your optimizer after"; `use_orig_params=False` by default)
    - torch 2.13 `distributed/fsdp/_flat_param.py::FlatParamHandle.flatten_tensors_into_flat_param`,
      `_use_unsharded_views`, `_setattr_tensor`
    - torch 2.13 `distributed/fsdp/_fully_shard/_fsdp_param.py::FSDPParam._init_sharded_param`,
      `_setattr_on_modules`
    - https://github.com/huggingface/accelerate/issues/3256: an optimizer built before the FSDP wrap with
      `use_orig_params=False` never updates the model; every grad is None at `zero_grad`
    - https://github.com/huggingface/accelerate/issues/2665: "FSDP Model not learning during training, loss
      stays constant"; fixed by `fsdp_use_orig_params: true`
    - https://github.com/intelligent-machine-learning/dlrover/issues/584: nanoGPT with FSDP, "the loss does not
      decrease"; fixed in PR 585 by building the optimizer after the FSDP wrap
    - https://github.com/huggingface/accelerate/pull/3298: "`use_orig_params=False` requires model preparation
      before optimizer instantiation. This is a silent failure"
    - https://github.com/Lightning-Universe/lightning-GPT/pull/17: the optimizer was built from the module's
      parameters before FSDP wrapped it; fixed by building it from the wrapped model
    - Proof: tests/proofs/test_ld312_optimizer_before_wrap.py (gloo, 2 ranks): with the optimizer built before
      `FullyShardedDataParallel` or `fully_shard`, none of its tensors gets a gradient and the wrapped model's
      weights do not change in 3 steps; after the unsafe fix they train
    """

    code = "LD312"
    name = "optimizer-before-fsdp-wrap"
    severity = Severity.ERROR
    fix_kind = "unsafe"
    triggers = ("FullyShardedDataParallel", "fully_shard")  # an alias (`as FSDP`) is imported by its full name
    also_triggers = (("parameters(", "configure_optimizers"),)

    VALID = (
        Valid(
            """\
import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

model = FSDP(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
"""
        ),
        Valid(
            """\
import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
model = FSDP(model, use_orig_params=True)
optimizer.step()
"""
        ),
        Valid(
            """\
import torch
from torch.distributed.fsdp import fully_shard

optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)  # a first try, replaced below
fully_shard(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
optimizer.step()
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


def setup(model, policy):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model = FSDP(model, auto_wrap_policy=policy)
    return model, optimizer
""",
            lines=(6,),
            unsafe_fixed="""\
import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


def setup(model, policy):
    model = FSDP(model, auto_wrap_policy=policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, optimizer
""",
        ),
        Invalid(
            """\
import torch
from torch.distributed.fsdp import fully_shard

groups = [{"params": [p for n, p in model.named_parameters() if "bias" not in n], "weight_decay": 0.1}]
optimizer = torch.optim.AdamW(groups, lr=1e-4)
for block in model.layers:
    fully_shard(block)
fully_shard(model)
optimizer.step()
""",
            lines=(5,),
        ),
    )

    def check_python(self) -> None:
        facts = self.facts
        for call in facts.calls:
            if optimizer_class(facts, call) is not None:
                models = self._models(call)
            elif facts.method_name(call) == "configure_optimizers" and isinstance(call.func, cst.Attribute):
                models = [call.func.value]  # nanoGPT's `model.configure_optimizers(...)` builds one from its parameters
            else:
                continue
            for model in models:
                wrap = wrapped_after(facts, model, call)
                if wrap is None or wrap.kind not in WHAT_THE_WRAP_DOES or not self._flattens(wrap):
                    continue
                if not self._used_after(call, wrap):
                    continue
                wrapper, why, advice = WHAT_THE_WRAP_DOES[wrap.kind]
                line = self.context.span(wrap.call).line
                self.report(
                    call,
                    f"the optimizer is built from `{get_full_name_for_node(model)}`'s parameters before {wrapper} "
                    f"wraps it (line {line}): {why}, so the optimizer holds tensors the model no longer computes with; "
                    "they get no gradient, `step()` changes nothing and the model does not train; build the "
                    f"optimizer from the wrapped model after the wrap ({advice})",
                    fix=self._fix(call, wrap),
                )
                break

    def _models(self, call: cst.Call) -> list[cst.BaseExpression]:
        """The models whose ``parameters()``/``named_parameters()`` the optimizer's first argument reads, directly
        or through a name bound to parameter groups."""
        facts = self.facts
        given = argument_of(call, "params", 0)
        if given is None:
            return []
        names = [given, *facts.within(given, cst.Name)]  # parameter groups: `[{"params": decay}, ...]`
        sources = [given] + [o.node for n in names for o in facts.origins(n, call) if o.node is not n]
        found = []
        for source in sources:
            for inner in [source, *facts.within(source, cst.Call)]:
                if (
                    isinstance(inner, cst.Call)
                    and isinstance(inner.func, cst.Attribute)
                    and inner.func.attr.value in PARAMETER_METHODS
                ):
                    found.append(inner.func.value)
        return found

    def _flattens(self, wrap: Wrap) -> bool:
        """FSDP2 always; FSDP1 unless ``use_orig_params`` is True or unreadable."""
        if wrap.kind == "fsdp2":
            return True
        if any(arg.star == "**" for arg in wrap.call.args):
            return False
        given = argument_of(wrap.call, "use_orig_params", None)
        return given is None or constant_truth(known_value(self.facts, given)) is False

    def _used_after(self, call: cst.Call, wrap: Wrap) -> bool:
        """The optimizer ``call`` builds is read after the wrap, and not built again in between."""
        facts = self.facts
        owner = facts.parent(call)
        names = bound_names(facts, owner) if isinstance(owner, cst.Assign) else set()
        if len(names) != 1:
            return False
        name = next(iter(names))
        function = facts.enclosing_function(call)
        order = facts.index.order
        rebinds = [  # built again later on the same path (not under the opposite `if` of the build)
            b
            for b in facts.bindings(name, call)
            if b.function is function
            and order(b.statement) > order(call)
            and not never_together(facts, b.statement, call)
        ]
        reads = [r for r in facts.reads_of(name, function or facts.index.module) if order(r) > order(wrap.call)]
        return bool(reads) and all(order(b.statement) > order(reads[0]) for b in rebinds)

    def _fix(self, call: cst.Call, wrap: Wrap) -> Fix | None:
        """Move the optimizer's statement to just after the wrap's, when that is a plain move (see Fix safety)."""
        facts = self.facts
        moved, target = statement_of(facts, call), statement_of(facts, wrap.call)
        block = facts.parent(moved)
        if not isinstance(moved, cst.SimpleStatementLine) or len(moved.body) != 1 or facts.parent(target) is not block:
            return None
        if not isinstance(target, cst.SimpleStatementLine) or len(target.body) != 1:
            return None
        model = get_full_name_for_node(wrap.call.args[0].value) if wrap.call.args else None
        direct = any(
            isinstance(c.func, cst.Attribute)
            and c.func.attr.value in PARAMETER_METHODS
            and get_full_name_for_node(c.func.value) == model
            for c in facts.within(call, cst.Call)
        )
        if not direct:
            return None  # parameter groups gathered earlier hold the old parameters wherever the optimizer is built
        wrapping, building = target.body[0], moved.body[0]
        kept = isinstance(wrapping, cst.Expr) or (isinstance(wrapping, cst.Assign) and bound_names(facts, wrapping) == {model})
        body = list(block.body)
        between = body[body.index(moved) + 1 : body.index(target)]
        uses = read_names(facts, moved) - {model}
        own = bound_names(facts, building) if isinstance(building, cst.Assign) else set()
        if not kept or not own or any(read_names(facts, s) & own or rebinds_any(facts, s, uses) for s in [*between, target]):
            return None
        return Fix(
            Applicability.UNSAFE,
            "Build the optimizer after the wrap",
            replacements=((moved, cst.RemovalSentinel.REMOVE), (target, cst.FlattenSentinel([target, moved]))),
        )
