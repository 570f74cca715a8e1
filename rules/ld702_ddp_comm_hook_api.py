"""LD702 ddp-comm-hook-api: a DDP communication hook given to accelerate in a form it rejects or ignores.

Verified against accelerate 1.15 (`accelerate/utils/dataclasses.py`) and torch 2.13
(`torch/nn/parallel/distributed.py`):

- `KwargsHandler` is a plain mixin class with no `__init__`: `KwargsHandler(any_keyword=...)` raises
  `TypeError: KwargsHandler() takes no arguments`; `DistributedDataParallelKwargs` is a dataclass, so an
  unknown keyword (`ddp_communication_hook=`) raises `TypeError: ... got an unexpected keyword argument`.
- `DDPCommunicationHookType` is a plain `enum.Enum` (not a `str` enum) and `DistributedDataParallelKwargs` has
  no `__post_init__`: `register_comm_hook` looks the value up with `hook_map.get(self.comm_hook)`, so the string
  `"fp16"` or the torch function `fp16_compress_hook` finds nothing and no hook is registered, silently (the
  same for `comm_wrapper`).
- `Accelerator.prepare_model` calls `ddp_handler.register_comm_hook` only where it wraps the model in
  `DistributedDataParallel` (multi-device DDP and MULTI_CPU): under FSDP, DeepSpeed, Megatron-LM or XLA the
  handler's hook is never used.
- `DistributedDataParallel.register_comm_hook(state, hook)` raises `TypeError: Communication hook must be
  callable.` for a `hook` that is not callable (a string, or `None` when the arguments are swapped).
"""

from __future__ import annotations

import libcst as cst

from lintdist.comm_hooks import HOOK_ENUM, MEMBERS, WRAPPER_MEMBERS, hook_value
from lintdist.edits import with_arg_changes
from lintdist.facts import argument_of
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Rule, Valid

KWARGS_HANDLER_HOMES = ("accelerate.utils", "accelerate.utils.dataclasses")
KWARGS_HANDLER = frozenset(f"{m}.KwargsHandler" for m in KWARGS_HANDLER_HOMES)
DDP_KWARGS = frozenset(f"{m}.DistributedDataParallelKwargs" for m in ("accelerate", *KWARGS_HANDLER_HOMES))
ENUM_IMPORT = ("accelerate.utils", HOOK_ENUM)
DDP_KWARGS_IMPORT = ("accelerate.utils", "DistributedDataParallelKwargs")
# Keywords people write for the hook, and the field accelerate names it.
HOOK_SPELLINGS = frozenset({"ddp_communication_hook", "communication_hook", "ddp_comm_hook", "comm_hook"})
DDP_FIELDS = frozenset(
    {
        "dim",
        "broadcast_buffers",
        "bucket_cap_mb",
        "find_unused_parameters",
        "check_reduction",
        "gradient_as_bucket_view",
        "static_graph",
        "comm_hook",
        "comm_wrapper",
        "comm_state_option",
    }
)
# Backends under which `prepare` never wraps the model in DDP, so the handler's hook is unused.
NOT_DDP = {"FSDP": "FSDP", "DEEPSPEED": "DeepSpeed", "MEGATRON_LM": "Megatron-LM", "XLA": "XLA"}


class DdpCommHookApi(Rule):
    """
    ## What it does
    Reports a DDP communication hook handed over in a form that fails or
    does nothing:

    - `KwargsHandler(ddp_communication_hook=...)` (any keyword): `KwargsHandler`
      is accelerate's base mixin and takes no arguments;
    - `DistributedDataParallelKwargs(ddp_communication_hook=...)` (or
      `communication_hook=`, `ddp_comm_hook=`): not a field of the dataclass;
    - `DistributedDataParallelKwargs(comm_hook="fp16")`, or `comm_hook=` given
      torch's own `fp16_compress_hook`/`bf16_compress_hook`/`powerSGD_hook`/
      `batched_powerSGD_hook` (the same for `comm_wrapper=`): accelerate only
      recognises `DDPCommunicationHookType` members;
    - `ddp_model.register_comm_hook(hook, state)` with the arguments swapped,
      or a string as the hook.

    A hook set on `DistributedDataParallelKwargs` where the backend in force is
    FSDP, DeepSpeed, Megatron-LM or XLA is reported at info level: accelerate
    never uses it there.

    ## Why is this bad?
    The first two and the swapped `register_comm_hook` raise `TypeError`
    before (or as) the model is prepared. The string and the torch function
    are worse: `DDPCommunicationHookType` is a plain `Enum`, and
    `register_comm_hook` looks the value up in a dict keyed by its members,
    so `"fp16"` finds nothing and no hook is registered, without a warning.
    The run trains with full-precision all-reduce while the author believes
    gradients are compressed.

    ## Example
    ```python
    from accelerate import Accelerator
    from accelerate.utils import KwargsHandler
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    handler = KwargsHandler(ddp_communication_hook=default_hooks.fp16_compress_hook)
    accelerator = Accelerator(kwargs_handlers=[handler])
    ```

    ## Use instead
    ```python
    from accelerate import Accelerator
    from accelerate.utils import DDPCommunicationHookType, DistributedDataParallelKwargs

    handler = DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.FP16)
    accelerator = Accelerator(kwargs_handlers=[handler])
    ```

    ## Fix safety
    Safe: the fixed call asks accelerate for the hook the code names, through
    the only spelling accelerate reads: the class becomes
    `DistributedDataParallelKwargs` (when every other keyword is one of its
    fields), the keyword becomes `comm_hook`, and a string or torch hook
    function becomes the `DDPCommunicationHookType` member that registers the
    same torch function; the imports are added. Swapped positional
    `register_comm_hook` arguments are swapped back. A hook of your own (a
    local function) has no member: it is reported without a fix; register it
    on the prepared model with `model.register_comm_hook(state, hook)`.

    ## References
    - accelerate `accelerate/utils/dataclasses.py`: `KwargsHandler`,
      `DDPCommunicationHookType`, `DistributedDataParallelKwargs.register_comm_hook`
    - accelerate `accelerate/accelerator.py`: `Accelerator.prepare_model` (the hook
      is registered only where the model is wrapped in DDP)
    - torch `torch/nn/parallel/distributed.py`: `register_comm_hook`, `_check_comm_hook`
    - [accelerate: DDP communication hooks](https://huggingface.co/docs/accelerate/usage_guides/ddp_comm_hook)
    - [accelerate PR #2841: DDP communication hooks](https://github.com/huggingface/accelerate/pull/2841)
    """

    code = "LD702"
    name = "ddp-comm-hook-api"
    severity = Severity.ERROR
    fix_kind = "safe"
    triggers = ("comm_hook", "communication_hook", "comm_wrapper")

    VALID = (
        Valid(
            """\
from accelerate import Accelerator
from accelerate.utils import DDPCommunicationHookType, DistributedDataParallelKwargs

handler = DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.POWER_SGD, comm_state_option={"matrix_approximation_rank": 2})
accelerator = Accelerator(kwargs_handlers=[handler])
"""
        ),
        Valid(
            """\
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(model, device_ids=[local_rank])
model.register_comm_hook(dist.group.WORLD, default_hooks.fp16_compress_hook)
"""
        ),
        Valid(
            """\
from accelerate.utils import DistributedDataParallelKwargs

handler = DistributedDataParallelKwargs(comm_hook=args.comm_hook)
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
from accelerate import Accelerator
from accelerate.utils import KwargsHandler
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

handler = KwargsHandler(ddp_communication_hook=default_hooks.fp16_compress_hook)
accelerator = Accelerator(kwargs_handlers=[handler])
""",
            lines=(5,),
            fixed="""\
from accelerate import Accelerator
from accelerate.utils import DDPCommunicationHookType, DistributedDataParallelKwargs, KwargsHandler
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

handler = DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.FP16)
accelerator = Accelerator(kwargs_handlers=[handler])
""",
        ),
        Invalid(
            """\
from accelerate import Accelerator, DistributedDataParallelKwargs

ddp = DistributedDataParallelKwargs(find_unused_parameters=True, comm_hook="bf16")
accelerator = Accelerator(kwargs_handlers=[ddp])
""",
            lines=(3,),
            fixed="""\
from accelerate import Accelerator, DistributedDataParallelKwargs
from accelerate.utils import DDPCommunicationHookType

ddp = DistributedDataParallelKwargs(find_unused_parameters=True, comm_hook=DDPCommunicationHookType.BF16)
accelerator = Accelerator(kwargs_handlers=[ddp])
""",
        ),
        Invalid(
            """\
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD

state = powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=1)
ddp_model.register_comm_hook(powerSGD.powerSGD_hook, state)
""",
            lines=(4,),
            fixed="""\
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD

state = powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=1)
ddp_model.register_comm_hook(state, powerSGD.powerSGD_hook)
""",
        ),
        Invalid(
            """\
from accelerate import Accelerator, DDPCommunicationHookType, DistributedDataParallelKwargs, FullyShardedDataParallelPlugin

handler = DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.FP16)
accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(), kwargs_handlers=[handler])
""",
            lines=(3,),
        ),
    )

    def finish(self) -> None:
        facts = self.facts
        for call in facts.calls:
            if facts.callee_is(call, KWARGS_HANDLER) and call.args:
                self._kwargs_handler(call)
            elif facts.callee_is(call, DDP_KWARGS):
                self._ddp_kwargs(call)
            elif facts.method_name(call) == "register_comm_hook" and isinstance(call.func, cst.Attribute):
                self._register(call)

    # -- accelerate --------------------------------------------------------------------------

    def _kwargs_handler(self, call: cst.Call) -> None:
        hook_args = [arg for arg in call.args if arg.keyword is not None and arg.keyword.value in HOOK_SPELLINGS]
        message = (
            "`KwargsHandler` is accelerate's base mixin and takes no arguments: this raises "
            "`TypeError: KwargsHandler() takes no arguments`"
        )
        fix = None
        if hook_args:
            message += "; a DDP communication hook is set with `DistributedDataParallelKwargs(comm_hook=...)`"
            fields = DDP_FIELDS | HOOK_SPELLINGS
            if len(hook_args) == 1 and all(
                arg.keyword is not None and arg.keyword.value in fields for arg in call.args
            ):
                new_arg, imports = self._hook_arg(call, hook_args[0], wrapper=False)
                if new_arg is not None:
                    new = with_arg_changes(call, {id(hook_args[0]): new_arg})
                    new = new.with_changes(func=cst.Name("DistributedDataParallelKwargs"))
                    fix = Fix(
                        Applicability.SAFE,
                        "Use `DistributedDataParallelKwargs(comm_hook=...)`",
                        replacements=((call, new),),
                        imports=(*imports, DDP_KWARGS_IMPORT),
                    )
        self.report(call, message, fix=fix)

    def _ddp_kwargs(self, call: cst.Call) -> None:
        for arg in call.args:
            if arg.keyword is None:
                continue
            keyword = arg.keyword.value
            if keyword in HOOK_SPELLINGS and keyword != "comm_hook":
                new_arg, imports = self._hook_arg(call, arg, wrapper=False)
                fix = None
                if new_arg is not None and argument_of(call, "comm_hook", None) is None:
                    fix = Fix(
                        Applicability.SAFE,
                        "Rename the keyword to `comm_hook`",
                        replacements=((arg, new_arg),),
                        imports=imports,
                    )
                self.report(
                    arg,
                    f"`DistributedDataParallelKwargs` has no field `{keyword}`: this raises `TypeError: ... got an "
                    "unexpected keyword argument`; the field is `comm_hook`",
                    fix=fix,
                )
            elif keyword in {"comm_hook", "comm_wrapper"}:
                self._hook_value(call, arg, wrapper=keyword == "comm_wrapper")
        self._unused_backend(call)

    def _hook_value(self, call: cst.Call, arg: cst.Arg, wrapper: bool) -> None:
        kind, member = hook_value(self.facts, arg.value, call, wrapper)
        keyword = arg.keyword.value
        if kind in {"enum", "unknown"}:
            return
        fix = None
        if member is not None:
            new_arg, imports = self._hook_arg(call, arg, wrapper)
            if new_arg is not None:
                fix = Fix(
                    Applicability.SAFE,
                    f"Use `{HOOK_ENUM}.{member}`",
                    replacements=((arg, new_arg),),
                    imports=imports,
                )
        what = {"string": "a string", "torch": "torch's hook function", "local": "a function"}[kind]
        table = "wrapper_map.get(self.comm_wrapper)" if wrapper else "hook_map.get(self.comm_hook)"
        nothing = "no wrapper is applied" if wrapper else "no hook is registered"
        message = (
            f"`{keyword}=` is given {what}, but accelerate looks it up among `{HOOK_ENUM}` members only "
            f"(`register_comm_hook`: `{table}`): {nothing} and no error is raised"
        )
        if member is not None:
            message += f"; use `{HOOK_ENUM}.{member}`"
        elif kind == "local":
            message += "; register your own hook on the prepared model: `model.register_comm_hook(state, hook)`"
        else:
            members = [m for m in MEMBERS.values() if not wrapper or m in WRAPPER_MEMBERS]
            message += f"; use one of `{HOOK_ENUM}` {', '.join(members)}"
        self.report(arg, message, fix=fix)

    def _hook_arg(
        self, call: cst.Call, arg: cst.Arg, wrapper: bool
    ) -> tuple[cst.Arg | None, tuple[tuple[str, str], ...]]:
        """``arg`` under accelerate's keyword, with the enum member for a string or one of torch's hooks (and the
        import that needs); None where lintdist cannot write the value (a function of this file, an unknown value)."""
        kind, member = hook_value(self.facts, arg.value, call, wrapper)
        keyword = cst.Name("comm_wrapper" if wrapper else "comm_hook")
        if kind == "enum":  # only the keyword is wrong
            return arg.with_changes(keyword=keyword), ()
        if member is None or not _rewritable(arg.value, kind):
            return None, ()
        value = cst.Attribute(value=cst.Name(HOOK_ENUM), attr=cst.Name(member))
        return arg.with_changes(keyword=keyword, value=value), (ENUM_IMPORT,)

    def _unused_backend(self, call: cst.Call) -> None:
        hook = argument_of(call, "comm_hook", None)
        if hook is None:
            return
        kind, _ = hook_value(self.facts, hook, call, wrapper=False)
        if kind != "enum" or (isinstance(hook, cst.Attribute) and hook.attr.value == "NO"):
            return
        backend = self.settings.backend
        chosen = str(backend.value).upper() if backend is not None else ""
        if chosen in NOT_DDP:
            self.report(
                call,
                f"The backend in force is {NOT_DDP[chosen]}: accelerate registers `comm_hook` only on models it "
                "wraps in `DistributedDataParallel`, so this hook is never used",
                severity=Severity.INFO,
            )

    # -- raw DDP -----------------------------------------------------------------------------

    def _register(self, call: cst.Call) -> None:
        positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
        hook = argument_of(call, "hook", 1)
        if hook is not None and isinstance(hook, (cst.SimpleString, cst.ConcatenatedString)):
            self.report(
                hook,
                "`register_comm_hook(state, hook)` needs a callable hook: a string raises "
                "`TypeError: Communication hook must be callable.`",
            )
            return
        if len(positional) != 2 or len(call.args) != 2:
            return
        first, second = positional
        kind, _ = hook_value(self.facts, first.value, call, wrapper=False)
        second_kind, _ = hook_value(self.facts, second.value, call, wrapper=False)
        if kind in {"torch", "local"} and second_kind not in {"torch", "local"}:
            swapped = with_arg_changes(
                call,
                {
                    id(first): first.with_changes(value=second.value),
                    id(second): second.with_changes(value=first.value),
                },
            )
            self.report(
                call,
                "`register_comm_hook` takes `(state, hook)`: the hook is passed first, so torch checks the state as "
                "the hook and raises `TypeError: Communication hook must be callable.`",
                fix=Fix(Applicability.SAFE, "Swap the arguments: `(state, hook)`", replacements=((call, swapped),)),
            )


def _rewritable(value: cst.BaseExpression, kind: str) -> bool:
    """The argument itself is the literal or the torch function (not a name bound elsewhere to it)."""
    if kind == "string":
        return isinstance(value, cst.SimpleString)
    return isinstance(value, (cst.Name, cst.Attribute))
