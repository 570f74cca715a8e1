"""LD409 wrapped-forward-in-rank-guard: a DDP/FSDP/ZeRO-3 model's forward run by the main process alone."""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.collectives import joined_by_others
from lintdist.deepspeed_settings import DEEPSPEED_INITIALIZE, deepspeed_engine
from lintdist.facts import argument_of
from lintdist.literals import is_name
from lintdist.loop import UNWRAP_METHODS
from lintdist.main_process import MAIN_GUARD_TEXTS, main_only
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Rule, Valid
from lintdist.sharding import parameter_sharding
from lintdist.wrappers import forward_target, names_bound_to_wrapped, wrapper_calls

GATHERS = (
    "all-gathers the sharded parameters in every forward, a collective the other ranks never join, and the job hangs"
)
# What says, in the file, that the DDP model holds buffers (the broadcast a `no_grad` forward still makes)
BUFFER_SIGNS = ("BatchNorm", "register_buffer", "running_mean")
DDP_BUFFERS = (
    "DDP's forward broadcasts the module's buffers (BatchNorm statistics) from rank 0 on the first forward and "
    "whenever the previous one ran with gradients on (the first evaluation after training), under `no_grad` too"
)


class WrappedForwardInRankGuard(Rule):
    """
    ## What it does
    Reports a forward (`model(x)`, `model.forward(x)`, and `generate` on a
    sharded model) of a model wrapped for data parallelism that only the
    main process runs: under `if rank == 0:`, `if accelerator.is_main_process:`,
    after `if not is_main: return`, or in a helper called from there. The
    model is a `DistributedDataParallel`, `FullyShardedDataParallel` or
    `fully_shard` model built in the script, the model
    `accelerator.prepare` returns, or a `deepspeed.initialize` engine (or
    its `.module`). An error under FSDP and under ZeRO stage 3 as the script
    or the launch says (`.module` and `unwrap_model` there too), and under
    DDP where the file shows that the model holds buffers (`BatchNorm`,
    `register_buffer`), which the forward broadcasts; a warning under DDP
    with gradients on and no buffer in sight (the first forward after the
    first backward rebuilds the buckets), and where the backend is unknown
    (an accelerate model with no launch settings, an engine whose stage is
    not in sight).
    Not reported: `model.module(x)` and `accelerator.unwrap_model(model)(x)`
    under DDP, a DDP model run under `no_grad` when it is built with
    `broadcast_buffers=False` or nothing in the file shows a buffer (nanoGPT's
    rank-0 `estimate_loss()`: its GPT registers no buffer with flash
    attention, so the forward makes no collective), and a DeepSpeed engine or
    prepared model the project runs with ZeRO stage 0-2 (whole parameters).

    ## Why is this bad?
    The wrappers make collectives inside the forward. FSDP (1 and 2) and
    ZeRO-3 all-gather each layer's parameters before running it, in every
    forward, also under `no_grad`; unwrapping the model does not help, since
    its parameters stay sharded. DDP's `_pre_forward` broadcasts the module
    buffers from rank 0 when the previous forward ran with gradients on and
    the model has buffers, and rebuilds its gradient buckets (a collective)
    on the first forward with gradients on after the first backward. The
    main process waits in that collective for ranks that never come, and
    the job hangs at the next barrier or until the timeout.

    ## Example
    ```python
    net = nn.Sequential(nn.Linear(16, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 1))
    model = DDP(net, device_ids=[local_rank])
    ...
    if dist.get_rank() == 0:
        with torch.no_grad():
            val_loss = criterion(model(val_x), val_y)
    dist.barrier()
    ```

    ## Use instead
    ```python
    if dist.get_rank() == 0:
        with torch.no_grad():
            val_loss = criterion(model.module(val_x), val_y)
    dist.barrier()
    ```
    Under FSDP or ZeRO-3, run the evaluation on every rank (and reduce the
    metric), or gather a full state dict into a separate model on rank 0.

    ## Fix safety
    Unsafe, and only for a DDP model built in the script: `model(x)` becomes
    `model.module(x)`. It skips DDP's buffer broadcast and bucket rebuild,
    so rank 0 evaluates with its own buffers (what the broadcast would have
    copied from it anyway); a backward on that output no longer averages
    gradients. No fix under FSDP or ZeRO-3 (the evaluation must run on every
    rank), nor for an accelerate model (`accelerator.unwrap_model(model)`
    needs the accelerator's name, and the backend may shard).

    ## References
    - torch 2.13 `torch/nn/parallel/distributed.py::DistributedDataParallel._pre_forward` (`_rebuild_buckets`
      when grad is enabled; `_check_sync_bufs_pre_fwd` -> `_sync_buffers`), `::will_sync_module_buffers`
      (`require_forward_param_sync and forward_sync_buffers and len(self.modules_buffers) > 0`) and
      `::_post_forward` (`require_forward_param_sync` True after a forward with gradients on, False in `no_grad`)
    - torch 2.13 FSDP1 `torch/distributed/fsdp/_runtime_utils.py::_pre_forward` -> `_unshard` and FSDP2
      `FSDPParamGroup.unshard`: an all-gather in every forward
    - https://github.com/pytorch/pytorch/issues/54059: validation under `if gpu == 0` with the DDP model, then
      `dist.barrier()`, hangs; the maintainer: use `model.module(data)` (`no_grad` alone still hangs)
    - https://github.com/FareedKhan-dev/train-llm-from-scratch/pull/32: final evaluation on rank 0 with the
      DDP-wrapped model "launches an NCCL collective with no peer"; fixed by evaluating the unwrapped model
    - https://github.com/pytorch/pytorch/issues/101335: FSDP all-gathers in `forward`, so every rank must run it
    - Proof: tests/proofs/test_ld409_rank0_forward.py (gloo, 2 ranks): rank 0 evaluating a DDP model with a
      BatchNorm buffer under `no_grad` hangs (process-group timeout); after the fix (`model.module`) it finishes
    """

    code = "LD409"
    name = "wrapped-forward-in-rank-guard"
    severity = Severity.ERROR
    needs_several_processes = True
    fix_kind = "unsafe"
    triggers = (
        "DistributedDataParallel",
        "FullyShardedDataParallel",
        "fully_shard",
        "prepare(",
        "deepspeed.initialize",
    )
    also_triggers = (MAIN_GUARD_TEXTS,)

    VALID = (
        Valid(
            """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8))
model = DDP(net, device_ids=[local_rank])
if dist.get_rank() == 0:
    with torch.no_grad():
        print(model.module(val_x).mean())
dist.barrier()
"""
        ),
        Valid(
            """\
import torch
from accelerate import Accelerator

accelerator = Accelerator()
model = accelerator.prepare(model)
if accelerator.is_main_process:
    with torch.no_grad():
        preds = accelerator.unwrap_model(model)(batch)
"""
        ),
        Valid(
            """\
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(net, broadcast_buffers=False)
if rank == 0:
    with torch.no_grad():
        preds = model(val_x)
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8))
model = DDP(net, device_ids=[local_rank])
if dist.get_rank() == 0:
    with torch.no_grad():
        print(model(val_x).mean())
dist.barrier()
""",
            lines=(9,),
            unsafe_fixed="""\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8))
model = DDP(net, device_ids=[local_rank])
if dist.get_rank() == 0:
    with torch.no_grad():
        print(model.module(val_x).mean())
dist.barrier()
""",
        ),
        Invalid(
            """\
import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

model = FSDP(net)

def evaluate(batch):
    with torch.no_grad():
        return model(batch).loss

if rank == 0:
    print(evaluate(val_batch))
""",
            lines=(8,),
        ),
    )

    def finish(self) -> None:
        facts = self.facts
        seen: set[int] = set()
        loop = self.loop
        names = names_bound_to_wrapped(
            facts, lambda c: loop.is_accelerate_prepare(c) or facts.callee_is(c, DEEPSPEED_INITIALIZE)
        )
        for call in facts.calls if names else ():
            target = forward_target(call)
            generate = isinstance(call.func, cst.Attribute) and call.func.attr.value == "generate"
            if generate:
                target = call.func.value
            if is_name(target, "self") or not isinstance(target, (cst.Name, cst.Attribute, cst.Call)):
                continue
            if not self._may_name_model(target, call, names):
                continue
            hit = main_only(facts, call)  # first: few calls are under a guard, and the wrapper is the costly question
            if hit is None or id(hit[0]) in seen:
                continue
            wrapper = self._wrapper(target, call)
            if wrapper is None or (generate and wrapper[0] == "ddp") or joined_by_others(facts, hit[1] or call):
                continue
            if self._report(call, target, hit, *wrapper):
                seen.add(id(hit[0]))

    def _may_name_model(self, target: cst.BaseExpression, at: cst.Call, names: set[str]) -> bool:
        """Whether ``target`` can run a wrapped model as far as names tell: its last name (past ``.module`` and
        ``unwrap_model(...)``) is one ``names`` holds, or a parameter of its function (a helper given the model)."""
        if isinstance(target, cst.Call):
            if not target.args:
                return False
            target = target.args[0].value
        if isinstance(target, cst.Attribute) and target.attr.value == "module":
            target = target.value
        last = target.attr.value if isinstance(target, cst.Attribute) else getattr(target, "value", None)
        if not isinstance(last, str):
            return False
        return last in names or (isinstance(target, cst.Name) and self.facts.parameter(last, at) is not None)

    def _wrapper(self, target: cst.BaseExpression, at: cst.Call) -> tuple[str, cst.Call | None, bool] | None:
        """What wraps the model ``target`` runs ("ddp", "fsdp", "deepspeed", "prepared"), the wrapping call, and
        whether ``target`` is past the wrapper (``model.module``, ``accelerator.unwrap_model(model)``); None when it
        runs no wrapped model."""
        facts = self.facts
        if isinstance(target, cst.Call):  # `accelerator.unwrap_model(model)(x)`
            if facts.method_name(target) not in UNWRAP_METHODS or not target.args:
                return None
            prepared = self.loop.prepared_model(target, at)
            return ("prepared", prepared, True) if prepared is not None else None
        inner = isinstance(target, cst.Attribute) and target.attr.value == "module"
        if deepspeed_engine(facts, target, at):
            return "deepspeed", None, inner
        wrapped = target.value if inner else target
        for kind in ("fsdp1", "fsdp2", "ddp"):
            calls = wrapper_calls(facts, wrapped, at, kind)
            if calls:
                return ("ddp" if kind == "ddp" else "fsdp"), calls[0], inner
        prepared = self.loop.prepared_model(target, at)
        if prepared is None:
            return None
        unwrapped = inner or any(
            isinstance(o.node, cst.Call) and facts.method_name(o.node) in UNWRAP_METHODS
            for o in facts.origins(target, at)
        )
        return "prepared", prepared, unwrapped

    def _report(self, call: cst.Call, target, hit, kind: str, wrapping: cst.Call | None, unwrapped: bool) -> bool:
        facts = self.facts
        guard, via = hit
        name = cst.Module([]).code_for_node(target)
        line = self.context.span(guard).line
        where = f"only the main process runs it (the main-process guard at line {line}"
        where += f", through `{get_full_name_for_node(via.func)}()`)" if via is not None else ")"
        no_grad = facts.under_no_grad(call)
        sharded, evidence = parameter_sharding(facts, self.settings)
        fix, severity = None, None
        if kind == "fsdp" or (kind in {"prepared", "deepspeed"} and sharded):
            why = "FSDP" if kind == "fsdp" else evidence
            past = "; unwrapping does not help, the parameters stay sharded" if unwrapped else ""
            message = (
                f"`{name}` runs a sharded model ({why}{past}): {where}, but it {GATHERS}; run the evaluation on "
                "every rank"
            )
        elif unwrapped:
            return False  # past DDP's wrapper, or a backend that may keep whole parameters
        elif kind == "ddp" or (kind == "prepared" and sharded is False and not evidence.startswith("DeepSpeed")):
            buffers = not self._no_buffer_sync(wrapping) and any(w in self.context.text for w in BUFFER_SIGNS)
            if buffers:
                does = f"{DDP_BUFFERS}: the other ranks never join and the job hangs"
            elif no_grad:
                return False  # no buffer to broadcast in sight, and no bucket rebuild without gradients
            else:
                severity = Severity.WARNING
                does = (
                    "with gradients on, DDP's forward rebuilds its gradient buckets (a collective) on the first forward "
                    "after the first backward, and broadcasts the module's buffers if it has any: the other ranks never "
                    "join and the job hangs"
                )
            remedy = "call the wrapped module (`model.module(...)`, `accelerator.unwrap_model(model)(...)`)"
            message = f"`{name}` is wrapped in DDP and {where}: {does}; {remedy}"
            fix = self._unwrap_fix(target) if kind == "ddp" else None
        elif sharded is False:
            return False
        else:
            severity = Severity.WARNING
            message = (
                f"`{name}` is a distributed model and {where}: it hangs under FSDP and DeepSpeed ZeRO-3, where it "
                f"{GATHERS}, and under DDP when the model has buffers and the previous forward ran with gradients on; "
                "run the evaluation on every rank (under DDP, `accelerator.unwrap_model(model)(...)` on the main "
                "process is enough)"
            )
        self.report(call, message, severity=severity, fix=fix)
        return True

    def _no_buffer_sync(self, wrapping: cst.Call | None) -> bool:
        """The DDP wrapper is built with ``broadcast_buffers=False``."""
        value = argument_of(wrapping, "broadcast_buffers", None) if wrapping is not None else None
        return value is not None and is_name(value, "False")

    def _unwrap_fix(self, target: cst.BaseExpression) -> Fix:
        unwrapped = cst.Attribute(value=target, attr=cst.Name("module"))
        return Fix(Applicability.UNSAFE, "Call the module inside DDP", replacements=((target, unwrapped),))
