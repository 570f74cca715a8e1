"""LD602 ddp-module-prefix: a wrapped model's own `state_dict()` saved, so every key starts with `module.`."""

from __future__ import annotations

import libcst as cst

from lintdist.facts import argument_of
from lintdist.file_io import TORCH_SAVES
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Rule, Valid
from lintdist.state_dicts import loaded_into, prefix_stripped_when_alone, state_dict_calls, unwrapped
from lintdist.wrappers import is_wrapped, wrapper_kind

COMPILES = frozenset({"torch.compile"})
SHARDED = frozenset({"FSDP", "DEEPSPEED"})


class DdpModulePrefix(Rule):
    """
    ## What it does
    Reports `model.state_dict()` saved with `torch.save` or
    `accelerator.save` (directly, in a checkpoint dict, or through a name
    bound to it, a state dict whose entries are then moved with
    `state[key] = tensor.cpu()` included) when `model` is the model
    `accelerator.prepare(...)` returned (unpacked, or picked out of its results
    by position: `parts = accelerator.prepare(model, loader)`, `model =
    parts[0]`; then compiled or moved or not) or a `DistributedDataParallel(...)`
    wrapper, and the launch does not run a single process. Not reported: `accelerator.unwrap_model(model).state_dict()`,
    `model.module.state_dict()`, `accelerator.get_state_dict(model)`, a
    name rebound to `accelerator.unwrap_model(model)` before the save, and a
    file that resumes into the wrapper and strips the `module.` prefix only
    in a one-process run (`if not args.distributed and ...: sd = {k[len("module."):]: v ...}`),
    which saved the wrapper on purpose.

    ## Why is this bad?
    DDP keeps the user's model as its `module` attribute, so the wrapper's
    `state_dict()` names every tensor `module.<name>`. The checkpoint then
    fails to load into a plain model (`load_state_dict` raises "Missing
    key(s) in state_dict ... Unexpected key(s) in state_dict: module.…"), or
    loads nothing with `strict=False`. Under FSDP or DeepSpeed the prepared
    model's `state_dict()` is not the full model either (a DeepSpeed engine
    also prefixes `module.`; FSDP may return shards):
    `accelerator.get_state_dict(model)` gathers a full, unprefixed one.

    ## Example
    ```python
    model, optimizer = accelerator.prepare(model, optimizer)
    ...
    accelerator.save(model.state_dict(), "model.pt")
    ```

    ## Use instead
    ```python
    accelerator.save(accelerator.unwrap_model(model).state_dict(), "model.pt")
    ```
    Under FSDP or DeepSpeed: `accelerator.save(accelerator.get_state_dict(model),
    "model.pt")`, called on every rank. Raw DDP: `model.module.state_dict()`.

    ## Fix safety
    The fix is safe: it changes only the key names of what is saved (and,
    under FSDP/DeepSpeed, gathers the full weights). `unwrap_model` also
    strips a `torch.compile` wrapper put around the prepared model (accelerate's
    `dynamo_backend`) only with `keep_torch_compile=False`, which the fix adds
    when the launch compiles the model. When the file calls `torch.compile`
    itself the message asks for `keep_torch_compile=False` too, but no fix is offered: compiled inside the DDP wrapper, the keys carry
    `_orig_mod.` after unwrapping too. Under FSDP or DeepSpeed,
    `get_state_dict` is a collective: no fix is offered where a rank guard
    keeps some processes from the save (it would hang; call it on every rank
    and keep only the write guarded). No fix either where the model is
    wrapped on some paths only (`if ddp: model = DDP(model)`: `.module`
    would fail on the others), nor where the file also loads checkpoints
    back into the wrapped model (`model.load_state_dict(...)`, also under a
    name the saved one was copied from, `original = model`; or the model
    handed to a `restart_from_checkpoint`-like helper): the prefix is what
    that loading expects, so both sides must change together. That finding
    is info: this program reads its own checkpoints back fine, and only a
    reader that loads them into the plain model fails.

    ## References
    - accelerate `Accelerator.unwrap_model` / `extract_model_from_parallel`
      (`while isinstance(model, options): model = model.module`;
      `keep_torch_compile`) and `Accelerator.get_state_dict`
    - torch `DistributedDataParallel` (the wrapped model is `self.module`)
    - NVIDIA/apex issue #647: "DDP prefixes state_dict with `module.*`", so the
      saved model cannot be loaded into the non-wrapped one (same as torch DDP)
    - pytorch/pytorch PR #53224: `consume_prefix_in_state_dict_if_present`, the
      loading-side workaround
    - Lightning-AI/pytorch-lightning issue #17996 and deepchem/deepchem PR #4201:
      key mismatches from DDP-wrapped checkpoints
    - AlmondGod/tinyworlds PR #13: `_orig_mod.` keys from a compiled model
    """

    code = "LD602"
    name = "ddp-module-prefix"
    severity = Severity.WARNING
    fix_kind = "safe"
    triggers = ("state_dict()",)
    also_triggers = (("prepare(", "DistributedDataParallel", "DDP("),)

    VALID = (
        Valid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
model = accelerator.prepare(model)
accelerator.save(accelerator.unwrap_model(model).state_dict(), "model.pt")
"""
        ),
        Valid(
            """\
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(net)
torch.save(model.module.state_dict(), "model.pt")
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
model, optimizer = accelerator.prepare(model, optimizer)
accelerator.save(model.state_dict(), "model.pt")
""",
            lines=(5,),
            fixed="""\
from accelerate import Accelerator

accelerator = Accelerator()
model, optimizer = accelerator.prepare(model, optimizer)
accelerator.save(accelerator.unwrap_model(model).state_dict(), "model.pt")
""",
        ),
        Invalid(
            """\
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(net)
checkpoint = {"model": model.state_dict(), "step": step}
if torch.distributed.get_rank() == 0:
    torch.save(checkpoint, "ckpt.pt")
""",
            lines=(5,),
            fixed="""\
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(net)
checkpoint = {"model": model.module.state_dict(), "step": step}
if torch.distributed.get_rank() == 0:
    torch.save(checkpoint, "ckpt.pt")
""",
        ),
    )

    def finish(self) -> None:
        facts = self.facts
        if self.loop.surely_single:
            return
        seen: set[int] = set()
        for call in facts.calls:
            accelerator_save = (
                facts.method_name(call) == "save"
                and isinstance(call.func, cst.Attribute)
                and facts.accelerator_like(call.func.value, call)
            )
            obj = argument_of(call, "obj", 0)
            if obj is None or not (accelerator_save or facts.callee_is(call, TORCH_SAVES)):
                continue
            for state_dict in state_dict_calls(facts, self.loop, obj, call):
                if id(state_dict) not in seen:
                    seen.add(id(state_dict))
                    self._check(state_dict, call)

    def _report_loaded_back(self, model: cst.BaseExpression, loaded: str, state_dict: cst.Call) -> None:
        target = _code(model)
        into = f"`{target}` itself" if loaded == target else f"`{loaded}` (the same model as `{target}`)"
        # the file reads checkpoints back into the wrapped model: the prefix is what it expects there, so nothing
        # fails in this program; only a reader that loads into the plain model is hurt (info)
        self.report(
            state_dict,
            f"`{target}` is a DDP-wrapped or prepared model: its `state_dict()` keys all start with `module.` "
            f"and will not load into the plain model; this file also loads checkpoints into {into}, "
            "so change the saving and the loading side together (save the unwrapped model's state dict, "
            "load it into the unwrapped model)",
            severity=Severity.INFO,
        )

    def _check(self, state_dict: cst.Call, save: cst.Call) -> None:
        facts = self.facts
        model = state_dict.func.value
        if unwrapped(facts, self.loop, model, state_dict):
            return
        compiled = any(facts.callee_is(call, COMPILES) for call in facts.calls)
        target = _code(model)
        if is_wrapped(self.facts, model, state_dict):
            loaded = loaded_into(facts, self.loop, model, state_dict)
            if loaded is not None and prefix_stripped_when_alone(facts):
                return  # saved wrapped on purpose: resumed into the wrapper, stripped for a one-process run
            if loaded is not None:
                self._report_loaded_back(model, loaded, state_dict)
                return
            fix = None
            origins = facts.origins(model, state_dict)
            always = all(wrapper_kind(facts, o.node) == "ddp" for o in origins)
            if not compiled and always:
                new = state_dict.with_changes(
                    func=state_dict.func.with_changes(value=cst.parse_expression(f"{target}.module"))
                )
                fix = Fix(Applicability.SAFE, f"Save `{target}.module.state_dict()`", replacements=((state_dict, new),))
            remedy = (
                f"`{target}.module.state_dict()`" if always else f'`getattr({target}, "module", {target}).state_dict()`'
            )
            self.report(
                state_dict,
                f"`{target}` is {'' if always else 'on some paths '}wrapped in `DistributedDataParallel`: its "
                f"`state_dict()` keys then all start with `module.` and will not load into the plain model; "
                f"save {remedy}",
                fix=fix,
            )
            return
        if self.loop.prepared_model(model, state_dict) is None or self.loop.role(model, state_dict) is not None:
            return  # not prepared, or a prepared optimizer or scheduler (its keys carry no prefix)
        loaded = loaded_into(facts, self.loop, model, state_dict)
        if loaded is not None:
            self._report_loaded_back(model, loaded, state_dict)
            return
        accelerator = self.facts.accelerator_at(save)
        shown = accelerator or "accelerator"
        backend = self.loop.backend
        if backend in SHARDED:
            replacement = f"{shown}.get_state_dict({target})"
            reach = facts.all_ranks_reach(save)
            message = (
                f"`{target}` was prepared under {backend}: its own `state_dict()` is not the full, plain model; "
                f"use `{replacement}` on every rank"
            )
            if reach.value is not True:
                message += " (it is a collective: move it out of the rank guard, keep only the write guarded)"
            fix = None
            if accelerator is not None and reach.value is True:
                fix = Fix(
                    Applicability.SAFE,
                    f"Use `{replacement}`",
                    replacements=((state_dict, cst.parse_expression(replacement)),),
                )
            self.report(state_dict, message, fix=fix)
            return
        dynamo = self.settings.get("dynamo_backend")
        dynamo_on = dynamo is not None and str(dynamo.value).strip().lower() not in {"", "no", "none"}
        # unwrap_model keeps a torch.compile wrapper by default: its keys would carry `_orig_mod.`
        keyword = ", keep_torch_compile=False" if dynamo_on or compiled else ""
        replacement = f"{shown}.unwrap_model({target}{keyword}).state_dict()"
        fix = None
        if accelerator is not None and not compiled:
            fix = Fix(
                Applicability.SAFE,
                f"Save `{replacement}`",
                replacements=((state_dict, cst.parse_expression(replacement)),),
            )
        self.report(
            state_dict,
            f"`{target}` is the model `prepare()` returned (DDP-wrapped on several processes): its `state_dict()` "
            f"keys all start with `module.` and will not load into the plain model; save `{replacement}`",
            fix=fix,
        )


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)
