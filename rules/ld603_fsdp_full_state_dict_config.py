"""LD603 fsdp-full-state-dict-config: FSDP1 `FULL_STATE_DICT` taken with the default (GPU, every rank) config."""

from __future__ import annotations

import libcst as cst

from lintdist.facts import argument_of
from lintdist.file_io import saved_on_main_only
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Rule, Valid
from lintdist.value_uses import assigned_reads

FSDP_CLASSES = (
    "torch.distributed.fsdp.FullyShardedDataParallel",
    "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel",
)
# torch 2.13 `FSDP.state_dict_type(module, state_dict_type, state_dict_config=None, optim_state_dict_config=None)`
# (a context manager) and `FSDP.set_state_dict_type(...)`, the same parameters; both staticmethods.
CONTEXT = frozenset(f"{c}.state_dict_type" for c in FSDP_CLASSES)
SETTER = frozenset(f"{c}.set_state_dict_type" for c in FSDP_CLASSES)
TYPE_ARG = ("state_dict_type", 1)
CONFIG_ARG = ("state_dict_config", 2)
FULL = "StateDictType.FULL_STATE_DICT"
CONFIG_HOME = "torch.distributed.fsdp"
CONFIG = "FullStateDictConfig(offload_to_cpu=True, rank0_only=True)"


class FsdpFullStateDictConfig(Rule):
    """
    ## What it does
    Reports `FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT)`
    (the context manager) and `FSDP.set_state_dict_type(model,
    StateDictType.FULL_STATE_DICT)` given no `state_dict_config` (or
    `None`), when the state dict is taken: the `with` body (for the setter,
    the rest of its function) calls `state_dict()`, or a helper named for
    saving or for state dicts (`save_checkpoint(model)`). The report
    points at the call and suggests the newer API as well.

    ## Why is this bad?
    Without a config FSDP uses `FullStateDictConfig()`, whose defaults are
    `offload_to_cpu=False` and `rank0_only=False` (torch
    `torch/distributed/fsdp/api.py`): every rank all-gathers the whole model
    and keeps the full copy on its GPU while `state_dict()` runs, so a model
    that only fits sharded runs out of GPU memory at the first checkpoint,
    hours into training. torch's own docstring recommends
    `FullStateDictConfig(offload_to_cpu=True, rank0_only=True)`: the
    parameters are gathered one FSDP unit at a time and copied to CPU on rank
    0 only. Loading is not concerned (FSDP ignores both flags when it loads a
    full state dict), so a `with` block that only calls `load_state_dict` (or
    only reads parameters) is not reported. Since torch 2.2,
    `torch.distributed.checkpoint.state_dict.get_model_state_dict(model,
    options=StateDictOptions(full_state_dict=True, cpu_offload=True))` does
    the same for FSDP1, FSDP2 and DDP, and `FSDP.state_dict_type` itself
    emits a `FutureWarning` in torch 2.13.

    ## Example
    ```python
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT):
        state = model.state_dict()
    if dist.get_rank() == 0:
        torch.save(state, "model.pt")
    ```

    ## Use instead
    ```python
    with FSDP.state_dict_type(
        model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
    ):
        state = model.state_dict()
    if dist.get_rank() == 0:
        torch.save(state, "model.pt")
    ```

    ## Fix safety
    The fix passes `state_dict_config=FullStateDictConfig(offload_to_cpu=True,
    rank0_only=True)` (and imports it from `torch.distributed.fsdp`). With
    `rank0_only=True` the other ranks get an EMPTY dict, and every rank gets
    CPU tensors. So the fix is safe only when each `x = ....state_dict()` of
    the block is read under a rank-0 guard (`if rank == 0:`,
    `is_main_process`, an earlier `if rank != 0: return`) or handed to
    `accelerator.save` (which writes on the main process only). Otherwise
    (the dict saved per rank, loaded back, returned, inspected, or taken in a
    helper lintdist cannot see) it is unsafe. A `state_dict()` call that only
    rank 0 makes is reported without a fix: the collective would hang either
    way.

    ## References
    - torch `torch/distributed/fsdp/api.py` (`StateDictConfig`, `FullStateDictConfig`: defaults and the
      recommendation) and `fully_sharded_data_parallel.py::set_state_dict_type`
    - torch `torch/distributed/fsdp/_state_dict_utils.py` (the load hook ignores both flags)
    - pytorch/pytorch#75908 (`FullStateDictConfig` rank0_only/CPU offload), facebookresearch/fairscale#844,
      Lightning-AI/pytorch-lightning#11207 (full state dict on every rank runs hosts out of memory)
    - [torch.distributed.checkpoint.state_dict](https://pytorch.org/docs/stable/distributed.checkpoint.html)
    """

    code = "LD603"
    name = "fsdp-full-state-dict-config"
    severity = Severity.WARNING
    fix_kind = "safe"
    triggers = ("FULL_STATE_DICT",)

    VALID = (
        Valid(
            """\
from torch.distributed.fsdp import FullStateDictConfig, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

config = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, config):
    state = model.state_dict()
"""
        ),
        Valid(
            """\
from torch.distributed.fsdp import StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT):
    model.load_state_dict(torch.load("model.pt"))
"""
        ),
        Valid(
            """\
from torch.distributed.fsdp import StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
    state = model.state_dict()
"""
        ),
        Valid(
            """\
from torch.distributed.fsdp import StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT):
    assert (model.lin.weight == 0).all()
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
import torch.distributed as dist
from torch.distributed.fsdp import StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT):
    state = model.state_dict()
if dist.get_rank() == 0:
    torch.save(state, "model.pt")
""",
            lines=(5,),
            fixed="""\
import torch.distributed as dist
from torch.distributed.fsdp import FullStateDictConfig, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, state_dict_config=FullStateDictConfig(offload_to_cpu=True, rank0_only=True)):
    state = model.state_dict()
if dist.get_rank() == 0:
    torch.save(state, "model.pt")
""",
        ),
        Invalid(
            """\
import torch.distributed.fsdp as fsdp

def save(model, path):
    fsdp.FullyShardedDataParallel.set_state_dict_type(model, fsdp.StateDictType.FULL_STATE_DICT, None)
    torch.save(model.state_dict(), f"{path}.rank{dist.get_rank()}")
""",
            lines=(4,),
            fixed=None,
            unsafe_fixed="""\
import torch.distributed.fsdp as fsdp
from torch.distributed.fsdp import FullStateDictConfig

def save(model, path):
    fsdp.FullyShardedDataParallel.set_state_dict_type(model, fsdp.StateDictType.FULL_STATE_DICT, FullStateDictConfig(offload_to_cpu=True, rank0_only=True))
    torch.save(model.state_dict(), f"{path}.rank{dist.get_rank()}")
""",
        ),
    )

    def finish(self) -> None:
        facts = self.facts
        for call in facts.calls:
            context = facts.callee_is(call, CONTEXT)
            if not context and not facts.callee_is(call, SETTER):
                continue
            kind = argument_of(call, *TYPE_ARG)
            if kind is None or not any(
                n.startswith(CONFIG_HOME) and n.endswith(FULL) for n in facts.qualified_names(kind)
            ):
                continue
            config = argument_of(call, *CONFIG_ARG)
            if config is not None and not (isinstance(config, cst.Name) and config.value == "None"):
                continue
            region = self._region(call, context)
            if region is None:
                continue
            takes = [
                c
                for c in _method_calls(facts, region, call)
                if facts.method_name(c) == "state_dict" and isinstance(c.func, cst.Attribute)
            ]
            if not takes and not any(_may_take(facts, c) for c in _method_calls(facts, region, call)):
                continue  # loading (FSDP ignores the config's flags there), or nothing taken in sight
            applicability = self._applicability(takes)
            message = (
                "`FULL_STATE_DICT` without a `state_dict_config` gathers the whole model on every rank's GPU "
                "(`offload_to_cpu=False, rank0_only=False`) and can run out of memory at checkpoint time: pass "
                f"`{CONFIG}`"
                + ("" if applicability is Applicability.SAFE else " (other ranks then get an empty dict)")
                + "; with torch >= 2.2 prefer `get_model_state_dict(model, options=StateDictOptions("
                "full_state_dict=True, cpu_offload=True))`"
            )
            fix = None
            if applicability is not None:
                fix = Fix(
                    applicability,
                    f"Pass `{CONFIG}`",
                    replacements=((call, _with_config(call, config)),),
                    imports=((CONFIG_HOME, "FullStateDictConfig"),),
                )
            self.report(call, message, fix=fix)

    def _region(self, call: cst.Call, context: bool) -> cst.CSTNode | None:
        """Where the setting is in force: the `with` body, or the setter's function (module)."""
        facts = self.facts
        if context:
            parent = facts.parent(call)
            item = parent if isinstance(parent, cst.WithItem) else None
            statement = facts.parent(item) if item is not None else None
            return statement.body if isinstance(statement, cst.With) else None
        function = facts.enclosing_function(call)
        return function if function is not None else facts.index.module

    def _applicability(self, takes: list[cst.Call]) -> Applicability | None:
        """SAFE when every state dict taken is used on rank 0 only; None when only rank 0 takes it."""
        if not takes:
            return Applicability.UNSAFE  # taken in a helper: its uses are not in sight
        facts = self.facts
        for take in takes:
            if facts.rank_guard(take) is not None:
                return None
            if not self._used_on_main_only(take):
                return Applicability.UNSAFE
        return Applicability.SAFE

    def _used_on_main_only(self, take: cst.Call) -> bool:
        facts = self.facts
        parent = facts.parent(take)
        if isinstance(parent, cst.Arg):
            return saved_on_main_only(facts, parent)
        reads = assigned_reads(facts, take)
        return bool(reads) and all(
            facts.rank_guard(read) is not None
            or (isinstance(argument := facts.parent(read), cst.Arg) and saved_on_main_only(facts, argument))
            for read in reads
        )


def _method_calls(facts, region: cst.CSTNode, after: cst.Call) -> list[cst.Call]:
    start = facts.index.end(after)
    return [c for c in facts.within(region, cst.Call) if facts.index.order(c) >= start]


def _may_take(facts, call: cst.Call) -> bool:
    """A call that may take the state dict out of sight: a helper named for saving or for state dicts."""
    name = facts.method_name(call) or ""
    if name == "load_state_dict" or "optim" in name:  # the optimizer's state dict has a config of its own
        return False
    return "save" in name.lower() or name.endswith("state_dict")


def _with_config(call: cst.Call, config: cst.BaseExpression | None) -> cst.Call:
    value = cst.parse_expression(CONFIG)
    if config is not None:  # an explicit `None`: replaced where it stands
        return call.deep_replace(config, value)
    arg = cst.Arg(
        keyword=cst.Name("state_dict_config"),
        value=value,
        equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
    )
    args = list(call.args)
    last = args[-1]
    args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return call.with_changes(args=[*args, arg.with_changes(comma=last.comma)])
