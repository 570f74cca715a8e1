"""LD311 peft-after-wrap: `get_peft_model` applied to a model that was already wrapped for data parallelism.

What the libraries do, read in their source:

* peft ``mapping_func.py::get_peft_model`` modifies the model in place ("the model will be modified in-place")
  and checks for no wrapper: ``BaseTuner.get_model_config`` reads ``getattr(model, "config", DUMMY_MODEL_CONFIG)``,
  and ``BaseTuner.inject_adapter`` replaces each targeted layer by a tuner layer holding new ``nn.Parameter``s
  (``lora_A``/``lora_B``), then freezes every other parameter (``_mark_only_adapters_as_trainable``).
* torch 2.13 ``DistributedDataParallel.__init__``: ``_build_params_for_reducer`` collects the module's parameters
  that require grad at that moment, ``_sync_module_states`` broadcasts them from rank 0 once, and
  ``_ddp_init_helper`` builds the reducer's buckets from that list. Nothing re-reads the module later, so
  parameters created afterwards get no all-reduce hook.
* accelerate 1.15 ``Accelerator.prepare_model`` wraps the model in DDP (or FSDP) on a multi-process launch and
  returns it unchanged on one process.
"""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import argument_of
from lintdist.model import Severity
from lintdist.rule import Invalid, Rule, Valid
from lintdist.wrap_order import wrapped_after, wrapped_before

GET_PEFT_MODEL = frozenset(
    {"peft.get_peft_model", "peft.mapping.get_peft_model", "peft.mapping_func.get_peft_model"}
)
WHAT_THE_WRAP_DID = {
    "ddp": (
        "DistributedDataParallel",
        "DDP registered the parameters and built its gradient buckets when it was constructed, so the adapter "
        "weights peft creates now get no all-reduce hook: each rank trains its own adapters and they drift apart "
        "silently (and start apart: they are initialised on each rank after DDP's one broadcast)",
    ),
    "fsdp1": (
        "FullyShardedDataParallel",
        "FSDP flattened and sharded the parameters when it was constructed, so the adapter weights peft creates "
        "now are outside its flat parameters: neither sharded nor reduced across ranks",
    ),
    "fsdp2": (
        "fully_shard",
        "fully_shard turned the parameters into sharded DTensors and grouped them for reduce-scatter when it ran, "
        "so the adapter weights peft creates now are plain tensors FSDP never reduces across ranks",
    ),
    "deepspeed": (
        "deepspeed.initialize",
        "the DeepSpeed engine took the parameters (and built its optimizer) when it was initialised, so the "
        "adapter weights peft creates now are neither in its optimizer nor reduced across ranks",
    ),
    "prepare": (
        "accelerator.prepare",
        "on a multi-process launch prepare wrapped it in DDP or FSDP, which register the parameters when they are "
        "built, so the adapter weights peft creates now are never reduced across ranks: each rank trains its own "
        "adapters and they drift apart silently",
    ),
}


class PeftAfterWrap(Rule):
    """
    ## What it does
    Reports `get_peft_model(model, config)` (peft) when `model` already went
    through a data-parallel wrapper earlier in the same function:
    `DistributedDataParallel(model)`, FSDP1's `FullyShardedDataParallel`,
    FSDP2's `fully_shard(model)`, `deepspeed.initialize(model=model)` or
    `accelerator.prepare(model)`. The model is followed through names: the
    wrapper's result itself, the wrapper's `.module`,
    `accelerator.unwrap_model(model)`, and the bare model a wrapper took (its
    name not bound again since). A wrap in another method or module, whose
    order lintdist cannot see, is not reported, nor is a PEFT model that is
    wrapped again afterwards (by a wrapper or a transformers `Trainer`), which
    then registers the adapters.

    ## Why is this bad?
    `get_peft_model` modifies the model in place: it replaces the targeted
    layers by layers with new adapter parameters (`lora_A`, `lora_B`) and
    freezes the rest. DDP collects the trainable parameters, broadcasts them
    once and builds its gradient buckets when it is constructed; FSDP
    flattens or shards them then. Parameters created afterwards are in none of
    these, so their gradients are never averaged: every rank trains its own
    adapters, which also start from different random values, and the saved
    adapter is whichever rank saved it. Nothing raises (peft 0.21 no longer
    fails on the wrapper's missing `config`, the error users met with
    `DataParallel`); the run looks healthy and the result is wrong. After
    `accelerator.prepare` this happens on a multi-process launch only (on one
    process prepare returns the model unchanged), so that case is a warning.

    ## Example
    ```python
    model = DistributedDataParallel(model, device_ids=[local_rank])
    model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    ```

    ## Use instead
    ```python
    model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    model = DistributedDataParallel(model, device_ids=[local_rank])
    ```

    ## Fix safety
    No fix: the call must move before the wrap, and the statements between
    (an optimizer built from `model.parameters()`, gradient checkpointing,
    moving to the device, the wrapper bound to another name) decide whether
    moving it keeps the script's meaning; lintdist cannot prove that.

    ## References
    - peft `mapping_func.py::get_peft_model` (in place, no wrapper check),
      `tuners/tuners_utils.py::BaseTuner.inject_adapter` and `get_model_config`
    - torch 2.13 `nn/parallel/distributed.py::DistributedDataParallel.__init__`
      (`_build_params_for_reducer`, `_sync_module_states`, `_ddp_init_helper`)
    - accelerate 1.15 `accelerator.py::Accelerator.prepare_model`
    - https://github.com/huggingface/peft/issues/114: `get_peft_model` on a
      `DataParallel` model; the maintainer: wrap with peft first, "before
      wrapping it in PyTorch DP, DDP or DeepSpeedEngine"
    - https://github.com/huggingface/peft/issues/1296: the same order with
      `DataParallel`, the same error
    - https://github.com/huggingface/transformers/pull/48792 (comment by qgallouedec, and PR 48873): with
      `fully_shard` run before `get_peft_model`, "each rank inits `lora_A` from its own rng", FSDP2
      "reduce-scatters only what it sharded", so "N ranks train N different adapters and rank 0's is the one saved"
    - Proof: tests/proofs/test_ld311_adapters_drift.py (gloo, 2 ranks): LoRA
      layers injected into `ddp.module` after the wrap (as peft does) train to
      different weights on the two ranks without an error; injected before the
      wrap they stay equal
    """

    code = "LD311"
    name = "peft-after-wrap"
    severity = Severity.ERROR
    fix_kind = "none"
    triggers = ("get_peft_model",)
    # the wrap must be in the file (the rule reads it in the PEFT call's own function)
    also_triggers = (
        ("DistributedDataParallel", "FullyShardedDataParallel", "fully_shard", "prepare(", "initialize("),
    )
    needs_several_processes = True

    VALID = (
        Valid(
            """\
from peft import LoraConfig, get_peft_model
from torch.nn.parallel import DistributedDataParallel

model = get_peft_model(model, LoraConfig(r=8))
model = DistributedDataParallel(model, device_ids=[local_rank])
"""
        ),
        Valid(
            """\
from accelerate import Accelerator
from peft import LoraConfig, get_peft_model

accelerator = Accelerator()
model = get_peft_model(model, LoraConfig(r=8))
model, optimizer = accelerator.prepare(model, optimizer)
accelerator.unwrap_model(model).save_pretrained("out")
"""
        ),
        Valid(
            """\
from peft import LoraConfig, get_peft_model
from torch.nn.parallel import DistributedDataParallel

if args.lora:
    model = get_peft_model(model, LoraConfig(r=8))
else:
    model = DistributedDataParallel(model)
"""
        ),
        Valid(
            """\
from peft import get_peft_model
from torch.nn.parallel import DistributedDataParallel as DDP
from transformers import Trainer

model = DDP(model)
peft_model = get_peft_model(model.module, config)
Trainer(model=peft_model, args=training_args).train()
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
from peft import LoraConfig, get_peft_model
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(model, device_ids=[local_rank])
model = get_peft_model(model, LoraConfig(r=8))
""",
            lines=(5,),
        ),
        Invalid(
            """\
import peft
from accelerate import Accelerator

accelerator = Accelerator()
model, optimizer = accelerator.prepare(model, optimizer)
model = peft.get_peft_model(accelerator.unwrap_model(model), config)
""",
            lines=(6,),
        ),
        Invalid(
            """\
from peft import get_peft_model
from torch.distributed.fsdp import fully_shard

def build(model, config):
    for block in model.layers:
        fully_shard(block)
    fully_shard(model)
    return get_peft_model(model, config)
""",
            lines=(8,),
        ),
    )

    def check_python(self) -> None:
        facts = self.facts
        for call in facts.calls:
            if not facts.callee_is(call, GET_PEFT_MODEL):
                continue
            model = argument_of(call, "model", 0)
            wrap = wrapped_before(facts, model, call) if model is not None else None
            if wrap is None or self._wrapped_again(call):
                continue
            wrapper, why = WHAT_THE_WRAP_DID[wrap.kind]
            line = self.context.span(wrap.call).line
            severity = Severity.WARNING if wrap.kind == "prepare" else Severity.ERROR
            self.report(
                call,
                f"`get_peft_model` is applied to a model already passed to `{wrapper}` (line {line}): {why}; "
                "apply peft to the bare model before the wrap",
                severity=severity,
            )

    def _wrapped_again(self, call: cst.Call) -> bool:
        """The PEFT model is wrapped afterwards (by a wrapper or a transformers ``Trainer``), which then registers
        the adapters: the first wrapper is left unused."""
        facts = self.facts
        owner = facts.parent(call)
        if not isinstance(owner, cst.Assign) or len(owner.targets) != 1:
            return False
        target = owner.targets[0].target
        key = get_full_name_for_node(target)
        if key is None:
            return False
        if wrapped_after(facts, target, call) is not None:
            return True
        order = facts.index.order
        return any(
            order(later) > order(call)
            and (get_full_name_for_node(later.func) or "").endswith("Trainer")
            and (given := argument_of(later, "model", 0)) is not None
            and get_full_name_for_node(given) == key
            for later in facts.calls
        )
