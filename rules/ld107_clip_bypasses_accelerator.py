"""LD107 clip-bypasses-accelerator: gradient clipping that skips accelerate, clips partial windows, or is ignored."""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.deepspeed_settings import DEFAULT_CLIPPING, NO_CLIPPING, UNKNOWN, gradient_clipping
from lintdist.edits import guarded_call
from lintdist.facts import argument_of
from lintdist.loop import TORCH_CLIPS, StepSite
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Rule, Valid

# The keywords `Accelerator.clip_grad_norm_(parameters, max_norm, norm_type=2)` and
# `Accelerator.clip_grad_value_(parameters, clip_value)` accept, by the torch function they stand for.
ACCEPTED = {
    "clip_grad_norm_": ("parameters", "max_norm", "norm_type"),
    "clip_grad_value_": ("parameters", "clip_value"),
}


def _method(rule: Rule, call: cst.Call) -> str:
    names = rule.facts.qualified_names(call.func) | {get_full_name_for_node(call.func) or ""}
    return "clip_grad_value_" if any(n.endswith("clip_grad_value_") for n in names) else "clip_grad_norm_"


class ClipBypassesAccelerator(Rule):
    """
    ## What it does
    Reports gradient clipping that does not do what an accelerate script means:
    `torch.nn.utils.clip_grad_norm_`/`clip_grad_value_` (under any import alias)
    on the parameters of a model prepared by `accelerator.prepare`; a clip
    (accelerate's or torch's) inside `with accelerator.accumulate(...)` that no
    `if accelerator.sync_gradients:` (or another accumulation gate) guards; and,
    under DeepSpeed, `accelerator.clip_grad_norm_(params, max_norm)` whose
    `max_norm` differs from the clipping DeepSpeed is configured with. The report
    points at the clip call. Torch's clip is an error under fp16 mixed precision
    or FSDP1 (the default FSDP version) and a warning otherwise; an unguarded
    clip inside `accumulate` is an error under fp16 (it raises), a warning
    otherwise; the DeepSpeed case is a warning.

    ## Why is this bad?
    `accelerator.clip_grad_norm_` first unscales fp16 gradients (the prepared
    optimizer's `GradScaler` has scaled them by up to 65536), and under FSDP1
    calls the wrapped model's `clip_grad_norm_`, which combines the norms of
    every rank's shard. Torch's function clips the scaled gradients, so the
    step is clipped to almost nothing, or clips each FSDP1 shard by its own
    local norm, so ranks disagree on the gradient. Inside `accumulate`, the
    clip runs on every micro-batch: on partial, not yet synchronised gradients,
    which changes the accumulated sum whenever a partial norm exceeds the
    threshold; accelerate does not skip it (`clip_grad_norm_` has no
    `sync_gradients` check), and under fp16 the second unscale of one window
    raises "unscale_() has already been called on this optimizer since the last
    update()". Under DeepSpeed, `accelerator.clip_grad_norm_` clips nothing and
    returns the engine's norm: DeepSpeed clips at its config's
    `gradient_clipping` (1.0 when accelerate fills "auto"; 0.0, no clipping,
    when a config file writes none), so another `max_norm` is silently
    ignored. The DeepSpeed JSON file an accelerate config names
    (`deepspeed_config_file`) is read. Not reported: models that were not
    prepared; `clip_grad_value_` under FSDP (element-wise clipping of a shard
    is exact, and accelerate's version raises there); a DeepSpeed config that
    lintdist cannot read (a config the code passes, a file it cannot find),
    or one whose `gradient_clipping` is the `max_norm` passed.

    ## Example
    ```python
    accelerator = Accelerator(mixed_precision="fp16", gradient_accumulation_steps=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for batch in loader:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Use instead
    ```python
    accelerator = Accelerator(mixed_precision="fp16", gradient_accumulation_steps=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for batch in loader:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Fix safety
    Safe. Torch's clip becomes `accelerator.clip_grad_norm_(params, max_norm)`
    (`clip_grad_value_` likewise), with the same arguments, when a name for the
    Accelerator is in scope there and no argument accelerate lacks
    (`error_if_nonfinite`, `foreach`) is passed. A clip alone on its line inside
    `accumulate` is wrapped in `if accelerator.sync_gradients:`, so it runs
    once per optimizer step, on the synchronised gradient, as accelerate's
    guide does. A clip whose result is assigned is not wrapped (the name would
    be unbound on the other micro-batches), and then gets no fix. The
    DeepSpeed case has no fix: the value belongs in
    `DeepSpeedPlugin(gradient_clipping=...)` or the DeepSpeed config.

    ## References
    - accelerate `Accelerator.clip_grad_norm_` / `clip_grad_value_` /
      `unscale_gradients`; `AcceleratedOptimizer.step` (`scaler.update()` only on
      sync steps)
    - torch `GradScaler.unscale_` ("unscale_() has already been called...")
    - accelerate `DeepSpeedPlugin.__post_init__` and `Accelerator._prepare_deepspeed`
      (`gradient_clipping` "auto" filled with 1.0)
    - accelerate guide "Performing gradient accumulation with Accelerate"
    """

    code = "LD107"
    name = "clip-bypasses-accelerator"
    severity = Severity.ERROR
    fix_kind = "safe"
    triggers = ("clip_grad_norm_", "clip_grad_value_")
    also_triggers = (("accelerat",),)

    VALID = (
        Valid(
            """\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    with accelerator.accumulate(model):
        accelerator.backward(model(**batch).loss)
        if accelerator.sync_gradients:
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
"""
        ),
        Valid(
            """\
import torch
from accelerate import Accelerator
from torch.nn.parallel import DistributedDataParallel

accelerator = Accelerator()
model = DistributedDataParallel(net.to(accelerator.device))
for batch in loader:
    model(batch).sum().backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
"""
        ),
        Valid(
            """\
from accelerate import Accelerator, DeepSpeedPlugin

accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2, gradient_clipping=0.5))
model, optimizer = accelerator.prepare(model, optimizer)
for batch in loader:
    accelerator.backward(model(**batch).loss)
    accelerator.clip_grad_norm_(model.parameters(), 0.5)
    optimizer.step()
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
import torch
from accelerate import Accelerator

accelerator = Accelerator(mixed_precision="fp16")
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    accelerator.backward(model(**batch).loss)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)  # keep it stable
    optimizer.step()
""",
            lines=(8,),
            fixed="""\
import torch
from accelerate import Accelerator

accelerator = Accelerator(mixed_precision="fp16")
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    accelerator.backward(model(**batch).loss)
    accelerator.clip_grad_norm_(model.parameters(), max_norm=1.0)  # keep it stable
    optimizer.step()
""",
        ),
        Invalid(
            """\
from accelerate import Accelerator
from torch.nn.utils import clip_grad_norm_ as clip

accelerator = Accelerator(gradient_accumulation_steps=2)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    with accelerator.accumulate(model):
        accelerator.backward(model(**batch).loss)
        clip(model.parameters(), 1.0)
        optimizer.step()
""",
            lines=(9,),
            fixed="""\
from accelerate import Accelerator
from torch.nn.utils import clip_grad_norm_ as clip

accelerator = Accelerator(gradient_accumulation_steps=2)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    with accelerator.accumulate(model):
        accelerator.backward(model(**batch).loss)
        if accelerator.sync_gradients:
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
""",
        ),
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=8)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    with accelerator.accumulate(model):
        accelerator.backward(model(**batch).loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
""",
            lines=(8,),
            fixed="""\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=8)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    with accelerator.accumulate(model):
        accelerator.backward(model(**batch).loss)
        if accelerator.sync_gradients:
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
""",
        ),
        Invalid(
            """\
from accelerate import Accelerator, DeepSpeedPlugin

plugin = DeepSpeedPlugin(zero_stage=2)
accelerator = Accelerator(deepspeed_plugin=plugin)
model, optimizer = accelerator.prepare(model, optimizer)
for batch in loader:
    accelerator.backward(model(**batch).loss)
    accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
    optimizer.step()
""",
            lines=(8,),
        ),
    )

    def finish(self) -> None:
        if not self.facts.imports("accelerate") and self.facts.project is None:
            return  # a helper module's model may still be prepared by the script that calls it
        for step in self.loop.steps:
            if step.kind != "clip":
                continue
            call = step.call
            if step.receiver is None and self.facts.callee_is(call, TORCH_CLIPS):
                self._torch_clip(step)
            elif step.receiver is not None and self.facts.accelerator_like(step.receiver, call):
                self._accelerate_clip(step)

    # -- torch.nn.utils.clip_grad_*_ ------------------------------------------------------------

    def _torch_clip(self, step: StepSite) -> None:
        call = step.call
        params = argument_of(call, "parameters", 0)
        prepare = self.loop.parameters_model(params, call) if params is not None else None
        if prepare is None:
            return
        method = _method(self, call)
        backend = self.loop.backend
        torch_name = f"torch.nn.utils.{method}"
        accelerator = self.loop.accelerator_at(prepare, call)
        shown = accelerator or get_full_name_for_node(prepare.func.value) or "accelerator"
        if backend == "DEEPSPEED":
            message = (
                f"`{torch_name}` on a DeepSpeed model: the engine holds the gradients and clips them itself, at "
                'its config\'s `gradient_clipping` (1.0 when accelerate fills "auto"); drop this call and set the '
                "threshold with `DeepSpeedPlugin(gradient_clipping=...)` or in the DeepSpeed config"
            )
            self.report(call, message, severity=Severity.WARNING)
            return
        version = self.loop.fsdp_version if backend == "FSDP" else None
        if backend == "FSDP" and method == "clip_grad_value_":
            return  # element-wise: exact on each shard, and accelerate's clip_grad_value_ raises under FSDP
        reasons = []
        if self.loop.fp16:
            reasons.append("under fp16 it clips the scaled gradients, so the step is clipped to almost nothing")
        if version == 1:
            reasons.append("under FSDP1 each rank clips its shard by the shard's own norm")
        certain = bool(reasons)
        ungated = self._ungated(step, prepare.func.value)
        if ungated:
            reasons.append("inside `accumulate` it also clips every micro-batch's partial, unsynchronised gradient")
        if not reasons:
            adds = "the fp16 unscaling" + (" and the FSDP norm" if method == "clip_grad_norm_" else "")
            reasons.append(f"it skips {adds} that accelerate's version adds")
        fix = self._replacement_fix(call, method, accelerator, ungated)
        message = (
            f"`{torch_name}` on the parameters of a prepared model bypasses `{shown}.{method}`: "
            f"{'; '.join(reasons)}; call `{shown}.{method}(...)`"
            + (f" under `if {shown}.sync_gradients:`" if ungated else "")
        )
        self.report(call, message, fix=fix, severity=None if certain else Severity.WARNING)

    def _replacement_fix(self, call: cst.Call, method: str, accelerator: str | None, ungated: bool) -> Fix | None:
        if accelerator is None:
            return None
        positional = [a for a in call.args if a.keyword is None]
        accepted = ACCEPTED[method]
        if any(a.star for a in call.args) or len(positional) > len(accepted):
            return None
        if any(a.keyword is not None and a.keyword.value not in accepted for a in call.args):
            return None
        new_call = call.with_changes(func=cst.Attribute(value=cst.parse_expression(accelerator), attr=cst.Name(method)))
        if not ungated:
            return Fix(Applicability.SAFE, f"Call `{accelerator}.{method}(...)`", replacements=((call, new_call),))
        wrapped = guarded_call(self.facts, call, f"{accelerator}.sync_gradients", new_call)
        if wrapped is None:
            return None
        return Fix(
            Applicability.SAFE,
            f"Call `{accelerator}.{method}(...)` under `if {accelerator}.sync_gradients:`",
            replacements=(wrapped,),
        )

    # -- accelerator.clip_grad_*_ ----------------------------------------------------------------

    def _accelerate_clip(self, step: StepSite) -> None:
        call, receiver = step.call, step.receiver
        method = _method(self, call)
        shown = get_full_name_for_node(receiver) or "accelerator"
        if self.loop.backend == "DEEPSPEED":
            if method == "clip_grad_norm_":
                self._deepspeed_threshold(call, shown)
            return
        if not self._ungated(step, receiver):
            return
        crash = self.loop.fp16
        message = (
            f"`{shown}.{method}` inside `{shown}.accumulate` runs on every micro-batch, on partial, unsynchronised "
            "gradients (accelerate does not skip it)"
            + (
                ', and under fp16 the second unscale of one window raises "unscale_() has already been called"'
                if crash
                else ", which changes the accumulated gradient whenever a partial norm exceeds the threshold"
            )
            + f"; guard it with `if {shown}.sync_gradients:`"
        )
        wrapped = guarded_call(self.facts, call, f"{shown}.sync_gradients")
        fix = (
            Fix(Applicability.SAFE, f"Guard the clip with `if {shown}.sync_gradients:`", replacements=(wrapped,))
            if wrapped is not None and get_full_name_for_node(receiver) is not None
            else None
        )
        self.report(call, message, fix=fix, severity=Severity.ERROR if crash else Severity.WARNING)

    def _ungated(self, step: StepSite, accelerator: cst.BaseExpression) -> bool:
        """A clip directly inside ``accumulate`` (same function), under no accumulation gate, while the
        Accelerator may accumulate."""
        block = self.loop.accumulate_block_of(step.call)
        if block is None or step.gate is not None:
            return False
        return self.loop.accumulation(block.accelerator, step.call).state != "none"

    # -- DeepSpeed -----------------------------------------------------------------------------------

    def _deepspeed_threshold(self, call: cst.Call, shown: str) -> None:
        """``accelerator.clip_grad_norm_(params, max_norm)`` with a ``max_norm`` DeepSpeed is not configured with."""
        max_norm = argument_of(call, "max_norm", 1)
        if max_norm is None:
            return
        configured = gradient_clipping(self.facts, self.context.settings, bool(self.loop.accelerators))
        if configured is UNKNOWN:
            return
        literal = isinstance(max_norm, (cst.Integer, cst.Float))
        if isinstance(configured, float) and literal and float(max_norm.evaluated_value) == configured:
            return
        if isinstance(configured, cst.BaseExpression) and _same_expression(configured, max_norm):
            return
        if isinstance(configured, cst.BaseExpression):
            said = f"`{cst.Module([]).code_for_node(configured)}`"
        elif configured is DEFAULT_CLIPPING:
            said = f'{configured}, accelerate\'s value for "auto"'
        elif configured is NO_CLIPPING:
            said = "0.0: the DeepSpeed file writes none, and DeepSpeed's default turns clipping off"
        else:
            said = str(configured)
        norm = cst.Module([]).code_for_node(max_norm)
        message = (
            f"under DeepSpeed `{shown}.clip_grad_norm_` clips nothing and only returns the engine's norm: DeepSpeed "
            f"clips at its config's `gradient_clipping` ({said}), so `max_norm={norm}` is ignored; set "
            f"`DeepSpeedPlugin(gradient_clipping={norm})` or `gradient_clipping` in the DeepSpeed config"
        )
        self.report(call, message, severity=Severity.WARNING)


def _same_expression(a: cst.BaseExpression, b: cst.BaseExpression) -> bool:
    return get_full_name_for_node(a) is not None and get_full_name_for_node(a) == get_full_name_for_node(b)
