"""LD104 fsdp-no-sync-memory: gradient accumulation under FSDP that skips the reduce-scatter, holding full gradients.

Under FSDP, a micro-batch whose backward runs without gradient synchronization (FSDP1 ``no_sync``, FSDP2
``set_requires_gradient_sync(False)``, which is what ``Accelerator.accumulate`` and the HF ``Trainer`` enter
on every micro-batch but the last of a window) keeps each rank's *unsharded* gradients until the window's
last backward. Verified in torch 2.13 (``FullyShardedDataParallel.no_sync`` docstring; FSDP2
``FSDPParamGroup.post_backward`` keeps ``unsharded_accumulated_grad`` while ``reduce_grads`` is False), accelerate
1.15 (``Accelerator.accumulate`` / ``no_sync``) and transformers 5.23 (``Trainer._inner_training_loop``).
"""

from __future__ import annotations

import libcst as cst

from lintdist.backends import (
    SYNC_EACH_BATCH,
    Evidence,
    accelerator_fsdp,
    accelerators_behind,
    is_training_arguments,
    trainer_syncs_each_batch,
    training_arguments_fsdp,
    with_sync_each_batch,
)
from lintdist.facts import argument_of
from lintdist.layout import appended, equal_like, inserted_after
from lintdist.literals import at_most_one, is_name, literal_truth
from lintdist.loop import GA_PLUGIN_CLASSES
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Rule, Valid
from lintdist.spelling import imported_name
from lintdist.wrappers import module_wrapper_kinds, never_shards, wrapper_kind

PLUGIN_IMPORT = ("accelerate.utils", "GradientAccumulationPlugin")
DOCS = "accelerate docs, gradient_synchronization.md: Mixtral-8x7B on 8xA100-80GB runs out of memory at GA=2"
SET_SYNC = "when memory is tight, set `sync_each_batch=True`"
CONSTRUCT = (
    "when memory is tight, construct the `Accelerator` with "
    "`gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps={}, sync_each_batch=True)`"
)


class FsdpNoSyncMemory(Rule):
    """
    ## What it does
    Reports gradient accumulation under FSDP that skips gradient synchronization
    on the micro-batches before the optimizer step: `accelerator.accumulate(...)`
    with `gradient_accumulation_steps` > 1 (or a `GradientAccumulationPlugin`)
    and no `sync_each_batch=True`, the HF `Trainer` with `fsdp` and
    `gradient_accumulation_steps` > 1, a raw FSDP1 model's `no_sync()` and an
    FSDP2 module's `set_requires_gradient_sync(False)`. FSDP comes from the
    code (`FullyShardedDataParallelPlugin` given to the `Accelerator`,
    `TrainingArguments(fsdp=...)`, `FullyShardedDataParallel(...)`,
    `fully_shard(...)`) or from the launch (`distributed_type: FSDP` in the
    accelerate config, `--use_fsdp`, `ACCELERATE_USE_FSDP=true`). The report
    points at the accumulation setting (the `gradient_accumulation_steps=`
    keyword, the plugin's `num_steps=`), or, when the accumulation comes from
    the launch, at the `accumulate` call; an
    `accelerator.gradient_accumulation_steps = n` assignment is reported where
    it is; for raw FSDP at the `no_sync` / `set_requires_gradient_sync` call.

    ## Why is this bad?
    FSDP saves memory by keeping only a shard of each gradient on each rank:
    after every backward the gradients are reduce-scattered and the full ones
    freed. Inside FSDP1's `no_sync()` (and under FSDP2's
    `set_requires_gradient_sync(False)`, which `accelerator.no_sync` uses)
    the reduce-scatter is skipped, so every rank accumulates the *unsharded*
    gradients of the whole model until the last micro-batch of the window.
    `accelerator.accumulate` and the HF `Trainer` enter that mode on every
    micro-batch but the last. The gradient memory is then that of an unsharded
    model, often the difference between fitting and running out of memory: the
    accelerate documentation fine-tunes Mixtral-8x7B on 8 A100-80GB GPUs at
    69 GB with one micro-batch, runs out of memory at
    `gradient_accumulation_steps=2`, and is back at 69 GB with
    `gradient_accumulation_steps=16` once `sync_each_batch=True`.

    Syncing every micro-batch costs one reduce-scatter per micro-batch instead
    of one per window (for DDP's all-reduce the accelerate docs measure about
    1.2x per step on one node and 2.2x across nodes), so this is a trade-off:
    keep `no_sync` when the unsharded gradients fit. Not reported: a
    `sync_each_batch` setting of any value on the plugin or in the Trainer's
    `accelerator_config` (the author decided), `sync_each_batch=True`
    anywhere in an accelerate script, DeepSpeed and plain DDP (whose gradients
    are not sharded anyway), an accumulation of 1, `accumulate` under an
    `Accelerator` whose backend is not known to be FSDP, the Trainer when its
    `fsdp` setting is not a literal lintdist can read and no launch says
    FSDP, and `set_requires_gradient_sync` in a file that does not call
    `fully_shard` itself (a library's own `no_sync`).

    ## Example
    ```python
    from accelerate import Accelerator, FullyShardedDataParallelPlugin

    accelerator = Accelerator(
        fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2),
        gradient_accumulation_steps=8,
    )
    for batch in loader:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Use instead
    ```python
    from accelerate import Accelerator, FullyShardedDataParallelPlugin
    from accelerate.utils import GradientAccumulationPlugin

    accelerator = Accelerator(
        fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2),
        gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=8, sync_each_batch=True),
    )
    ```
    With the HF `Trainer`:
    `TrainingArguments(..., accelerator_config={"gradient_accumulation_kwargs": {"sync_each_batch": True}})`.
    With raw FSDP, run every micro-batch's backward outside `no_sync()` (or
    keep `set_requires_gradient_sync(True)`).

    ## Fix safety
    Unsafe (opt-in with `--unsafe-fixes`): it trades speed for memory. The fix
    replaces `Accelerator(gradient_accumulation_steps=N)` with
    `Accelerator(gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=N, sync_each_batch=True))`
    (accelerate raises ValueError when both keywords are given, so the old one
    goes), importing `GradientAccumulationPlugin` from `accelerate.utils` unless
    the file already imports it (under any alias); it adds
    `sync_each_batch=True` to an existing `GradientAccumulationPlugin(...)`,
    and `accelerator_config={"gradient_accumulation_kwargs": {"sync_each_batch": True}}`
    (or the missing part of it) to `TrainingArguments`. No fix when the
    accumulation comes from the launch environment
    (`ACCELERATE_GRADIENT_ACCUMULATION_STEPS`, which accelerate ignores once a
    plugin is passed), for `accelerator.no_sync(...)` written by hand (the
    plugin does not change it) and for raw FSDP.

    ## References
    - accelerate docs, `concept_guides/gradient_synchronization.md`, "`no_sync`
      requires additional GPU memory when using FSDP" (the Mixtral table)
    - torch `FullyShardedDataParallel.no_sync` docstring: "This likely results
      in higher memory usage because FSDP will accumulate the full model
      gradients (instead of gradient shards) until the eventual sync"
    - torch FSDP2 `FSDPModule.set_requires_gradient_sync` ("the equivalence of
      `no_sync` in FSDP1") and `FSDPParamGroup.post_backward`
    - accelerate `Accelerator.accumulate` (`sync_each_batch` skips `no_sync`),
      `Accelerator.__init__` (both accumulation keywords raise ValueError),
      `GradientAccumulationPlugin`
    - transformers `Trainer._inner_training_loop` (`accelerator.no_sync` on all
      but the last micro-batch unless `sync_each_batch`) and
      `trainer_pt_utils.AcceleratorConfig.gradient_accumulation_kwargs`
    """

    code = "LD104"
    name = "fsdp-no-sync-memory"
    severity = Severity.WARNING
    fix_kind = "unsafe"
    triggers = ("accumulate(", "no_sync", "set_requires_gradient_sync", "gradient_accumulation_steps")

    VALID = (
        Valid(
            """\
from accelerate import Accelerator, FullyShardedDataParallelPlugin
from accelerate.utils import GradientAccumulationPlugin

accelerator = Accelerator(
    fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2),
    gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=4, sync_each_batch=True),
)
for batch in loader:
    with accelerator.accumulate(model):
        accelerator.backward(model(batch).sum())
"""
        ),
        Valid(
            """\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4)  # launched as plain DDP
for batch in loader:
    with accelerator.accumulate(model):
        accelerator.backward(model(batch).sum())
"""
        ),
        Valid(
            """\
from accelerate import Accelerator, DeepSpeedPlugin

accelerator = Accelerator(gradient_accumulation_steps=4, deepspeed_plugin=DeepSpeedPlugin(zero_stage=3))
for batch in loader:
    with accelerator.accumulate(model):
        accelerator.backward(model(batch).sum())
"""
        ),
        Valid(
            """\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=1)
for batch in loader:
    with accelerator.accumulate(model):
        accelerator.backward(model(batch).sum())
""",
            project={"config.yaml": "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n"},
        ),
        Valid(
            """\
from transformers import TrainingArguments

args = TrainingArguments(output_dir="out", fsdp="full_shard", gradient_accumulation_steps=1)
"""
        ),
        Valid(
            """\
from transformers import TrainingArguments

args = TrainingArguments(output_dir="out", fsdp_config={"version": 2}, gradient_accumulation_steps=8)
"""
        ),
        Valid(
            """\
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(model)
for step, batch in enumerate(loader):
    if (step + 1) % accum_steps != 0:
        with model.no_sync():
            model(batch).sum().backward()
    else:
        model(batch).sum().backward()
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
from accelerate import Accelerator, FullyShardedDataParallelPlugin

accelerator = Accelerator(
    fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2),
    gradient_accumulation_steps=8,
)
for batch in loader:
    with accelerator.accumulate(model):
        accelerator.backward(model(batch).sum())
""",
            lines=(5,),
            unsafe_fixed="""\
from accelerate import Accelerator, FullyShardedDataParallelPlugin
from accelerate.utils import GradientAccumulationPlugin

accelerator = Accelerator(
    fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2),
    gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=8, sync_each_batch=True),
)
for batch in loader:
    with accelerator.accumulate(model):
        accelerator.backward(model(batch).sum())
""",
        ),
        Invalid(
            """\
import accelerate
from accelerate.utils import GradientAccumulationPlugin as GAP


def build(args):
    plugin = GAP(num_steps=args.accum)
    return accelerate.Accelerator(gradient_accumulation_plugin=plugin)


accelerator = build(args)
for batch in loader:
    with accelerator.accumulate(model):
        accelerator.backward(model(batch).sum())
""",
            lines=(6,),
            project={"config.yaml": "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 1\n"},
            unsafe_fixed="""\
import accelerate
from accelerate.utils import GradientAccumulationPlugin as GAP


def build(args):
    plugin = GAP(num_steps=args.accum, sync_each_batch=True)
    return accelerate.Accelerator(gradient_accumulation_plugin=plugin)


accelerator = build(args)
for batch in loader:
    with accelerator.accumulate(model):
        accelerator.backward(model(batch).sum())
""",
        ),
        Invalid(
            """\
from transformers import Trainer, TrainingArguments

args = TrainingArguments(
    output_dir="out",
    fsdp=True,
    gradient_accumulation_steps=4,
    bf16=True,
)
Trainer(model=model, args=args, train_dataset=dataset).train()
""",
            lines=(6,),
            unsafe_fixed="""\
from transformers import Trainer, TrainingArguments

args = TrainingArguments(
    output_dir="out",
    fsdp=True,
    gradient_accumulation_steps=4,
    accelerator_config={"gradient_accumulation_kwargs": {"sync_each_batch": True}},
    bf16=True,
)
Trainer(model=model, args=args, train_dataset=dataset).train()
""",
        ),
        Invalid(
            """\
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

model = FSDP(model)
for step, batch in enumerate(loader):
    if (step + 1) % grad_accum != 0:
        with model.no_sync():
            model(batch).sum().backward()
        continue
    model(batch).sum().backward()
    optimizer.step()
""",
            lines=(6,),
        ),
        Invalid(
            """\
from torch.distributed.fsdp import fully_shard

fully_shard(model)
for step, batch in enumerate(loader):
    model.set_requires_gradient_sync((step + 1) % accum == 0)
    model(batch).sum().backward()
""",
            lines=(5,),
        ),
    )

    def finish(self) -> None:
        self._accelerate()
        self._trainer()
        self._raw_fsdp1()
        self._raw_fsdp2()

    # -- accelerate -----------------------------------------------------------------------------

    def _accelerate(self) -> None:
        facts, loop, settings = self.facts, self.loop, self.context.settings
        calls = [] if loop.sync_each_batch else [block.call for block in loop.accumulate_blocks]
        by_accelerator: dict[int, tuple[cst.Call | None, list[cst.Call]]] = {}
        for call in calls:
            for accelerator in accelerators_behind(facts, call.func.value, call):
                by_accelerator.setdefault(id(accelerator) if accelerator else 0, (accelerator, []))[1].append(call)
        for accelerator, found in by_accelerator.values():
            evidence = accelerator_fsdp(facts, settings, accelerator)
            if evidence is not None:
                self._report_accumulation(accelerator, found, evidence)
        # `accelerator.no_sync(model)` written by hand: sync_each_batch does not reach it
        for block in loop.no_sync_blocks:
            if block.kind != "accelerator":
                continue
            func = block.call.func
            accelerators = (
                accelerators_behind(facts, func.value, block.call) if isinstance(func, cst.Attribute) else [None]
            )
            evidence = next((e for a in accelerators if (e := accelerator_fsdp(facts, settings, a)) is not None), None)
            if evidence is not None:
                self.report(
                    block.call,
                    f"under FSDP ({evidence.describe(self.context.span)}) `accelerator.no_sync` skips the gradient "
                    "reduce-scatter, so every rank keeps the full, unsharded gradients of the model until the "
                    f"synchronizing micro-batch ({DOCS}); when memory is tight, run every micro-batch's backward "
                    "outside `no_sync` (`sync_each_batch=True` does not affect a hand-written `no_sync`)",
                )

    def _report_accumulation(self, accelerator: cst.Call | None, blocks: list[cst.Call], evidence: Evidence) -> None:
        launch = self.loop.launch_accumulation
        if accelerator is not None:
            steps = argument_of(accelerator, "gradient_accumulation_steps", None)
            plugin = argument_of(accelerator, "gradient_accumulation_plugin", None)
            if plugin is not None and steps is None:
                self._report_plugins(plugin, accelerator, evidence)
                return
            if plugin is None and steps is not None and not at_most_one(steps, self.facts, accelerator):
                # accelerate reads ACCELERATE_GRADIENT_ACCUMULATION_STEPS over the keyword when no plugin is given
                keyword = next(a for a in accelerator.args if a.keyword is not None and a.value is steps)
                fix = None if launch is not None else self._keyword_fix(accelerator, keyword)
                self.report(keyword, self._message(evidence, "`gradient_accumulation_steps`"), fix=fix)
                return
            if plugin is not None or (steps is not None and launch is None):
                return  # both keywords (accelerate raises on its own), or an accumulation of 1
        if launch is not None:
            where = f"`ACCELERATE_GRADIENT_ACCUMULATION_STEPS={launch.value}` at {launch.path}:{launch.line}"
            self.report(blocks[0], self._message(evidence, where, CONSTRUCT.format("N")))
            return
        # `accelerator.gradient_accumulation_steps = n` after construction (the property's setter); otherwise no
        # accumulation, or an Accelerator built out of sight with no launch setting (unknown)
        for assignment, target in self.loop.accumulation_setters:
            if len(assignment.targets) != 1 or at_most_one(assignment.value, self.facts, assignment):
                continue
            if accelerator in accelerators_behind(self.facts, target.value, assignment):
                # the setter changes only `num_steps` of the plugin's kwargs, so a plugin's sync_each_batch stays
                advice = CONSTRUCT.format(1) + " (this assignment then only changes `num_steps`)"
                self.report(assignment, self._message(evidence, "this assignment", advice))

    def _report_plugins(self, plugin: cst.BaseExpression, accelerator: cst.Call, evidence: Evidence) -> None:
        facts = self.facts
        for origin in facts.origins(plugin, accelerator):
            call = origin.node
            if not (isinstance(call, cst.Call) and origin.index is None and facts.callee_is(call, GA_PLUGIN_CLASSES)):
                continue
            if any(arg.star for arg in call.args) or argument_of(call, "sync_each_batch", 3) is not None:
                continue
            steps = argument_of(call, "num_steps", 0)
            if steps is None or at_most_one(steps, facts, call):
                continue  # no accumulation (a plugin without num_steps accumulates nothing: LD109)
            keyword = next(a for a in call.args if a.value is steps)
            new = cst.Arg(keyword=cst.Name("sync_each_batch"), value=cst.Name("True"), equal=equal_like(keyword))
            fix = Fix(
                Applicability.UNSAFE,
                "Add `sync_each_batch=True` to the plugin (reduce-scatter every micro-batch: less memory, slower)",
                replacements=((call, call.with_changes(args=appended(call.args, new, call.whitespace_before_args))),),
            )
            self.report(keyword, self._message(evidence, "the `GradientAccumulationPlugin`"), fix=fix)

    def _keyword_fix(self, accelerator: cst.Call, keyword: cst.Arg) -> Fix | None:
        if any(arg.star == "**" for arg in accelerator.args):
            return None  # the unpacked keywords may hold a plugin already
        name, imports = imported_name(self.facts, GA_PLUGIN_CLASSES, PLUGIN_IMPORT)
        if name is None:
            return None
        plugin = cst.parse_expression(f"{name}(num_steps=0, sync_each_batch=True)")
        plugin = plugin.deep_replace(plugin.args[0].value, keyword.value)
        new = keyword.with_changes(keyword=cst.Name("gradient_accumulation_plugin"), value=plugin)
        return Fix(
            Applicability.UNSAFE,
            "Pass `gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=..., sync_each_batch=True)` "
            "instead (reduce-scatter every micro-batch: less memory, slower)",
            replacements=((keyword, new),),
            imports=imports,
        )

    def _message(self, evidence: Evidence, what: str, advice: str = SET_SYNC) -> str:
        return (
            f"under FSDP ({evidence.describe(self.context.span)}) the accumulation set by {what} skips the gradient "
            "reduce-scatter on every micro-batch but the last, so each rank holds the full, unsharded gradients of "
            f"the model ({DOCS}); {advice}, which reduce-scatters each micro-batch (less memory, slower)"
        )

    # -- the HF Trainer -------------------------------------------------------------------------

    def _trainer(self) -> None:
        facts = self.facts
        for call in facts.calls:
            steps = argument_of(call, "gradient_accumulation_steps", None)  # the keyword first: it costs nothing
            if (
                steps is None
                or not is_training_arguments(facts, call)
                or trainer_syncs_each_batch(facts, call, self.loop.sync_each_batch)
            ):
                continue
            deepspeed = argument_of(call, "deepspeed", None)
            if at_most_one(steps, facts, call) or (deepspeed is not None and not is_name(deepspeed, "None")):
                continue
            evidence = training_arguments_fsdp(facts, self.context.settings, call)
            if evidence is None:
                continue
            keyword = next(a for a in call.args if a.keyword is not None and a.value is steps)
            message = (
                f"under FSDP ({evidence.describe(self.context.span)}) the Trainer runs every micro-batch but the "
                "last of each accumulation window in `accelerator.no_sync`, which skips the gradient reduce-scatter, "
                f"so each rank holds the full, unsharded gradients of the model ({DOCS}); when memory is tight, pass "
                '`accelerator_config={"gradient_accumulation_kwargs": {"sync_each_batch": True}}` '
                "(reduce-scatter each micro-batch: less memory, slower)"
            )
            self.report(keyword, message, fix=self._trainer_fix(call, keyword))

    def _trainer_fix(self, call: cst.Call, keyword: cst.Arg) -> Fix | None:
        if any(arg.star for arg in call.args):
            return None
        config = argument_of(call, "accelerator_config", None)
        if config is None:
            value = cst.parse_expression(f'{{"gradient_accumulation_kwargs": {SYNC_EACH_BATCH}}}')
            new = cst.Arg(keyword=cst.Name("accelerator_config"), value=value, equal=keyword.equal)
            args = inserted_after(call.args, list(call.args).index(keyword), new, call.whitespace_before_args)
            message = (
                'Add `accelerator_config={"gradient_accumulation_kwargs": {"sync_each_batch": True}}` '
                "(less memory, slower)"
            )
            return Fix(Applicability.UNSAFE, message, replacements=((call, call.with_changes(args=args)),))
        replacement = with_sync_each_batch(config)
        if replacement is None:
            return None
        message = (
            "Set `sync_each_batch` in the `gradient_accumulation_kwargs` of `accelerator_config` (less memory, slower)"
        )
        return Fix(Applicability.UNSAFE, message, replacements=((config, replacement),))

    # -- raw FSDP1 and FSDP2 ------------------------------------------------------------------

    def _raw_fsdp1(self) -> None:
        facts = self.facts
        built = module_wrapper_kinds(facts)
        for block in self.loop.no_sync_blocks:
            if block.kind != "model" or block.model is None:
                continue
            kinds = set()
            for origin in facts.origins(block.model, block.call):
                kind = wrapper_kind(facts, origin.node)
                if kind == "fsdp1" and never_shards(origin.node, self.context.module):
                    kind = "ddp"  # NO_SHARD keeps whole gradients anyway
                kinds.add(kind if kind in {"ddp", "fsdp1"} else "unknown")
            if kinds == {"fsdp1"} or (kinds == {"unknown"} and "fsdp1" in built and "ddp" not in built):
                self.report(
                    block.call,
                    "FSDP's `no_sync()` skips the gradient reduce-scatter, so every rank accumulates the full, "
                    "unsharded gradients of the model until the synchronizing micro-batch (torch: 'This likely "
                    f"results in higher memory usage'; {DOCS}); when memory is tight, run every micro-batch's "
                    "backward outside `no_sync` (one reduce-scatter each: less memory, slower)",
                )

    def _raw_fsdp2(self) -> None:
        # The file shards with `fully_shard` itself: a toggle elsewhere is a library's own `no_sync` (accelerate's
        # `Accelerator.no_sync`, the Trainer's deferred reduction), whose callers decide.
        if "fsdp2" not in module_wrapper_kinds(self.facts):
            return
        for node in self.loop.sync_toggles:
            if not isinstance(node, cst.Call) or self.facts.method_name(node) != "set_requires_gradient_sync":
                continue
            flag = argument_of(node, "requires_gradient_sync", 0)
            if flag is None or literal_truth(flag) is True:
                continue
            self.report(
                node,
                "`set_requires_gradient_sync` turns off FSDP2's reduce-scatter, so every rank accumulates the full, "
                f"unsharded gradients of the module until it is turned back on ({DOCS}); when memory is tight, keep "
                "gradient sync on for every micro-batch (one reduce-scatter each: less memory, slower)",
            )
