"""LD104 fsdp-no-sync-memory: gradient accumulation under FSDP that skips the reduce-scatter, holding full gradients.

Under FSDP, a micro-batch whose backward runs without gradient synchronization (FSDP1 ``no_sync``, FSDP2
``set_requires_gradient_sync(False)``, which is what ``Accelerator.accumulate`` and the HF ``Trainer`` enter
on every micro-batch but the last of a window) keeps each rank's *unsharded* gradients until the window's
last backward. Verified in torch 2.13 (``FullyShardedDataParallel.no_sync`` docstring; FSDP2
``FSDPParamGroup.post_backward`` keeps ``unsharded_accumulated_grad`` while ``reduce_grads`` is False), accelerate
1.15 (``Accelerator.accumulate`` / ``no_sync``) and transformers 5.23 (``Trainer._inner_training_loop``).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import ACCELERATOR_CLASSES, DDP_WRAPPERS, argument_of
from lintdist.launch import written
from lintdist.loop import FSDP_PLUGINS, GA_PLUGIN_CLASSES
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Rule, Valid

RAW_FSDP1 = frozenset(
    {
        "torch.distributed.fsdp.FullyShardedDataParallel",
        "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel",
    }
)
RAW_FSDP2 = frozenset(
    {
        "torch.distributed.fsdp.fully_shard",
        "torch.distributed._composable.fsdp.fully_shard",
        "torch.distributed.fsdp._fully_shard.fully_shard",
        "torch.distributed._composable.fsdp.fully_shard.fully_shard",
    }
)
TRAINING_ARGUMENTS = frozenset(
    {
        "transformers.TrainingArguments",
        "transformers.training_args.TrainingArguments",
        "transformers.Seq2SeqTrainingArguments",
        "transformers.training_args_seq2seq.Seq2SeqTrainingArguments",
    }
)
# TRL's trainer configs (`SFTConfig`, `DPOConfig`, `GRPOConfig`...) subclass TrainingArguments; `ModelConfig` does not.
TRL_NOT_TRAINING_ARGUMENTS = frozenset({"ModelConfig", "ScriptArguments"})
PLUGIN_IMPORT = ("accelerate.utils", "GradientAccumulationPlugin")
DOCS = "accelerate docs, gradient_synchronization.md: Mixtral-8x7B on 8xA100-80GB runs out of memory at GA=2"


@dataclass(frozen=True)
class Evidence:
    """Why lintdist believes FSDP is in force, in words for the message; ``{line}`` is filled in with the line of
    ``node`` only when a finding is reported (positions cost a printing pass over the file)."""

    template: str
    node: cst.CSTNode | None = None


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
        loop = self.loop
        calls = [] if loop.sync_each_batch else [block.call for block in loop.accumulate_blocks]
        by_accelerator: dict[int, tuple[cst.Call | None, list[cst.Call]]] = {}
        for call in calls:
            for accelerator in self._accelerator_calls(call.func.value, call):
                by_accelerator.setdefault(id(accelerator) if accelerator else 0, (accelerator, []))[1].append(call)
        for accelerator, found in by_accelerator.values():
            evidence = self._accelerator_fsdp(accelerator)
            if evidence is not None:
                self._report_accumulation(accelerator, found, evidence)
        # `accelerator.no_sync(model)` written by hand: sync_each_batch does not reach it
        for block in loop.no_sync_blocks:
            if block.kind != "accelerator":
                continue
            receiver = _receiver(block.call)
            accelerators = self._accelerator_calls(receiver, block.call) if receiver is not None else [None]
            evidence = next((e for a in accelerators if (e := self._accelerator_fsdp(a)) is not None), None)
            if evidence is not None:
                self.report(
                    block.call,
                    f"under FSDP ({self._where(evidence)}) `accelerator.no_sync` skips the gradient reduce-scatter, "
                    "so every rank keeps the full, unsharded gradients of the model until the synchronizing "
                    f"micro-batch ({DOCS}); when memory is tight, run every micro-batch's backward outside `no_sync` "
                    "(`sync_each_batch=True` does not affect a hand-written `no_sync`)",
                )

    def _accelerator_calls(self, expr: cst.BaseExpression, at: cst.CSTNode) -> list[cst.Call | None]:
        """The ``Accelerator(...)`` calls an expression can hold; [the file's only one] or [None] when unknown."""
        facts = self.facts
        found = [
            o.node
            for o in facts.origins(expr, at)
            if isinstance(o.node, cst.Call) and o.index is None and facts.callee_is(o.node, ACCELERATOR_CLASSES)
        ]
        if found:
            return list({id(c): c for c in found}.values())
        everywhere = self.loop.accelerators
        return [everywhere[0]] if len(everywhere) == 1 else [None]

    def _accelerator_fsdp(self, accelerator: cst.Call | None) -> Evidence | None:
        """FSDP for this Accelerator: a plugin it is always given, or the launch (when the code picks nothing else)."""
        if accelerator is not None:
            if _literal_true(argument_of(accelerator, "cpu", None)):
                return None
            if any(argument_of(accelerator, k, None) is not None for k in ("deepspeed_plugin", "deepspeed_plugins")):
                return None
            plugin = argument_of(accelerator, "fsdp_plugin", None)
            if plugin is not None and self._always(plugin, accelerator, FSDP_PLUGINS):
                return Evidence("the `Accelerator` at line {line} is given an FSDP plugin", accelerator)
        return self._launch_fsdp()

    def _always(self, value: cst.BaseExpression, at: cst.CSTNode, classes: frozenset[str]) -> bool:
        """Every value the keyword can receive is a call of one of ``classes`` built here."""
        facts = self.facts
        origins = facts.origins(value, at)
        return bool(origins) and all(
            isinstance(o.node, cst.Call) and o.index is None and facts.callee_is(o.node, classes) for o in origins
        )

    def _launch_fsdp(self) -> Evidence | None:
        settings = self.context.settings
        chosen = settings.backend if settings is not None else None
        if chosen is None or str(chosen.value).upper() != "FSDP":
            return None
        return Evidence(written(chosen).replace("{", "{{").replace("}", "}}"))

    def _report_accumulation(self, accelerator: cst.Call | None, blocks: list[cst.Call], evidence: Evidence) -> None:
        launch = self.loop.launch_accumulation
        if accelerator is not None:
            steps = argument_of(accelerator, "gradient_accumulation_steps", None)
            plugin = argument_of(accelerator, "gradient_accumulation_plugin", None)
            if plugin is not None and steps is None:
                self._report_plugins(plugin, accelerator, evidence)
                return
            if plugin is None and steps is not None and not _literal_one(steps, self.facts, accelerator):
                # accelerate reads ACCELERATE_GRADIENT_ACCUMULATION_STEPS over the keyword when no plugin is given
                keyword = next(a for a in accelerator.args if a.keyword is not None and a.value is steps)
                fix = None if launch is not None else self._keyword_fix(accelerator, keyword)
                self.report(keyword, self._message(evidence, "`gradient_accumulation_steps`"), fix=fix)
                return
            if plugin is not None or (steps is not None and launch is None):
                return  # both keywords (accelerate raises on its own), or an accumulation of 1
        if launch is not None:
            where = f"`ACCELERATE_GRADIENT_ACCUMULATION_STEPS={launch.value}` at {launch.path}:{launch.line}"
            self.report(blocks[0], self._message(evidence, where, launch_only=True))
            return
        # `accelerator.gradient_accumulation_steps = n` after construction (the property's setter)
        for assignment in self._accumulation_setters(accelerator):
            self.report(assignment, self._message(evidence, "this assignment", setter=True))
        # otherwise: no accumulation, or an Accelerator built out of sight with no launch setting (unknown)

    def _accumulation_setters(self, accelerator: cst.Call | None) -> list[cst.Assign]:
        """``x.gradient_accumulation_steps = n`` (n not 1) where ``x`` holds this Accelerator."""
        facts = self.facts
        found = []
        for assignment, target in self.loop.accumulation_setters:
            if len(assignment.targets) != 1 or _literal_one(assignment.value, facts, assignment):
                continue
            if accelerator in self._accelerator_calls(target.value, assignment):
                found.append(assignment)
        return found

    def _report_plugins(self, plugin: cst.BaseExpression, accelerator: cst.Call, evidence: Evidence) -> None:
        facts = self.facts
        for origin in facts.origins(plugin, accelerator):
            call = origin.node
            if not (isinstance(call, cst.Call) and origin.index is None and facts.callee_is(call, GA_PLUGIN_CLASSES)):
                continue
            if any(arg.star for arg in call.args) or argument_of(call, "sync_each_batch", 3) is not None:
                continue
            steps = argument_of(call, "num_steps", 0)
            if steps is None or _literal_one(steps, facts, call):
                continue  # no accumulation (a plugin without num_steps accumulates nothing: LD109)
            keyword = next(a for a in call.args if a.value is steps)
            new = cst.Arg(
                keyword=cst.Name("sync_each_batch"),
                value=cst.Name("True"),
                equal=_equal_like(keyword),
            )
            fix = Fix(
                Applicability.UNSAFE,
                "Add `sync_each_batch=True` to the plugin (reduce-scatter every micro-batch: less memory, slower)",
                replacements=((call, call.with_changes(args=_append(call.args, new, call.whitespace_before_args))),),
            )
            self.report(keyword, self._message(evidence, "the `GradientAccumulationPlugin`"), fix=fix)

    def _keyword_fix(self, accelerator: cst.Call, keyword: cst.Arg) -> Fix | None:
        if any(arg.star == "**" for arg in accelerator.args):
            return None  # the unpacked keywords may hold a plugin already
        name, imports = self._plugin_name()
        if name is None:
            return None
        tight = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))
        plugin = cst.Call(
            func=cst.parse_expression(name),
            args=(
                cst.Arg(
                    keyword=cst.Name("num_steps"),
                    value=keyword.value,
                    equal=tight,
                    comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")),
                ),
                cst.Arg(keyword=cst.Name("sync_each_batch"), value=cst.Name("True"), equal=tight),
            ),
        )
        new = keyword.with_changes(keyword=cst.Name("gradient_accumulation_plugin"), value=plugin)
        return Fix(
            Applicability.UNSAFE,
            "Pass `gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=..., sync_each_batch=True)` "
            "instead (reduce-scatter every micro-batch: less memory, slower)",
            replacements=((keyword, new),),
            imports=imports,
        )

    def _plugin_name(self) -> tuple[str | None, tuple[tuple[str, str], ...]]:
        """How the fix names ``GradientAccumulationPlugin``: a module-level import of it (alias kept), else a new
        ``from accelerate.utils import GradientAccumulationPlugin`` when that name is free."""
        names = self.facts.names
        for statement in self.facts.index.nodes(cst.ImportFrom):
            if isinstance(statement.names, cst.ImportStar) or statement.relative:
                continue
            module = get_full_name_for_node(statement.module) or ""
            for alias in statement.names:
                imported = f"{module}.{get_full_name_for_node(alias.name)}"
                bound = get_full_name_for_node(alias.asname.name if alias.asname else alias.name) or ""
                bindings = names.module_bindings(bound)
                if imported in GA_PLUGIN_CLASSES and bindings and all(b.node is statement for b in bindings):
                    return bound, ()
        if names.module_bindings(PLUGIN_IMPORT[1]):
            return None, ()
        return PLUGIN_IMPORT[1], (PLUGIN_IMPORT,)

    def _message(self, evidence: Evidence, what: str, launch_only: bool = False, setter: bool = False) -> str:
        if setter:  # the setter changes only `num_steps` of the plugin's kwargs, so a plugin's sync_each_batch stays
            advice = (
                "when memory is tight, construct the `Accelerator` with "
                "`gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=1, sync_each_batch=True)` "
                "(this assignment then only changes `num_steps`)"
            )
        elif launch_only:
            advice = (
                "when memory is tight, construct the `Accelerator` with "
                "`gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=N, sync_each_batch=True)`"
            )
        else:
            advice = "when memory is tight, set `sync_each_batch=True`"
        return (
            f"under FSDP ({self._where(evidence)}) the accumulation set by {what} skips the gradient reduce-scatter on "
            "every micro-batch but the last, so each rank holds the full, unsharded gradients of the model "
            f"({DOCS}); {advice}, which reduce-scatters each micro-batch (less memory, slower)"
        )

    # -- the HF Trainer -------------------------------------------------------------------------

    def _trainer(self) -> None:
        facts = self.facts
        for call in facts.calls:
            steps = argument_of(call, "gradient_accumulation_steps", None)  # the keyword first: it costs nothing
            if steps is None or not self._is_training_arguments(call) or self._trainer_syncs_each_batch(call):
                continue
            if _literal_one(steps, facts, call):
                continue
            deepspeed = argument_of(call, "deepspeed", None)
            if deepspeed is not None and not _is_none(deepspeed):
                continue
            evidence = self._trainer_fsdp(call)
            if evidence is None:
                continue
            keyword = next(a for a in call.args if a.keyword is not None and a.value is steps)
            message = (
                f"under FSDP ({self._where(evidence)}) the Trainer runs every micro-batch but the last of each "
                "accumulation window in `accelerator.no_sync`, which skips the gradient reduce-scatter, so each rank "
                f"holds the full, unsharded gradients of the model ({DOCS}); when memory is tight, pass "
                '`accelerator_config={"gradient_accumulation_kwargs": {"sync_each_batch": True}}` '
                "(reduce-scatter each micro-batch: less memory, slower)"
            )
            self.report(keyword, message, fix=self._trainer_fix(call, keyword))

    def _trainer_syncs_each_batch(self, call: cst.Call) -> bool:
        """``accelerator_config`` asks for ``sync_each_batch``, or is something lintdist cannot see into (a JSON
        file, a dict built elsewhere) while the file mentions ``sync_each_batch``. No ``accelerator_config``: no."""
        config = argument_of(call, "accelerator_config", None)
        if config is None:
            return any(arg.star == "**" for arg in call.args) and self.loop.sync_each_batch
        origins = self.facts.origins(config, call)
        seen = [_sync_each_batch_in(o.node) for o in origins]
        if seen and all(value is not None for value in seen):
            return any(seen)
        return self.loop.sync_each_batch or isinstance(config, cst.SimpleString)

    def _is_training_arguments(self, call: cst.Call) -> bool:
        facts = self.facts
        if facts.is_instance_of(call, TRAINING_ARGUMENTS):
            return True
        for name in facts.qualified_names(call.func):
            last = name.rsplit(".", 1)[-1]
            if name.startswith("trl.") and last.endswith("Config") and last not in TRL_NOT_TRAINING_ARGUMENTS:
                return True
        return False

    def _trainer_fsdp(self, call: cst.Call) -> Evidence | None:
        """FSDP for a TrainingArguments: a literal ``fsdp=`` that turns it on, else a launch that says FSDP
        (the Trainer's Accelerator reads ``ACCELERATE_USE_FSDP``). ``fsdp_config`` alone does nothing."""
        value = argument_of(call, "fsdp", None)
        if value is not None and _literal_truth(value):
            code = self.context.module.code_for_node(value).replace("{", "{{").replace("}", "}}")
            return Evidence(f"`fsdp={code}` at line {{line}}", value)
        # no `fsdp=`, a false one or one unknown here (`fsdp=args.fsdp`): FSDP only if the launch says so
        return self._launch_fsdp()

    def _where(self, evidence: Evidence) -> str:
        line = self.context.span(evidence.node).line if evidence.node is not None else 0
        return evidence.template.format(line=line)

    def _trainer_fix(self, call: cst.Call, keyword: cst.Arg) -> Fix | None:
        if any(arg.star for arg in call.args):
            return None
        message = (
            'Add `accelerator_config={"gradient_accumulation_kwargs": {"sync_each_batch": True}}` (less memory, slower)'
        )
        config = argument_of(call, "accelerator_config", None)
        equal = keyword.equal
        if config is None:
            new = cst.Arg(
                keyword=cst.Name("accelerator_config"),
                value=cst.parse_expression('{"gradient_accumulation_kwargs": {"sync_each_batch": True}}'),
                equal=equal,
            )
            index = list(call.args).index(keyword)
            args = _insert_after(call.args, index, new, call.whitespace_before_args)
            return Fix(Applicability.UNSAFE, message, replacements=((call, call.with_changes(args=args)),))
        replacement = self._config_with_sync(config)
        if replacement is None:
            return None
        message = (
            "Set `sync_each_batch` in the `gradient_accumulation_kwargs` of `accelerator_config` (less memory, slower)"
        )
        return Fix(Applicability.UNSAFE, message, replacements=((config, replacement),))

    def _config_with_sync(self, config: cst.BaseExpression) -> cst.BaseExpression | None:
        """``accelerator_config`` given as a dict literal or ``AcceleratorConfig(...)``, with sync_each_batch added."""
        sync = cst.DictElement(key=cst.SimpleString('"sync_each_batch"'), value=cst.Name("True"))
        if isinstance(config, cst.Dict):
            if any(not isinstance(e, cst.DictElement) for e in config.elements):
                return None
            inner = next(
                (e for e in config.elements if _string_key(e) == "gradient_accumulation_kwargs"),
                None,
            )
            if inner is None:
                element = cst.DictElement(
                    key=cst.SimpleString('"gradient_accumulation_kwargs"'),
                    value=cst.parse_expression('{"sync_each_batch": True}'),
                )
                return config.with_changes(elements=_append(config.elements, element, config.lbrace.whitespace_after))
            if isinstance(inner.value, cst.Dict) and all(isinstance(e, cst.DictElement) for e in inner.value.elements):
                value = inner.value
                elements = _append(value.elements, sync, value.lbrace.whitespace_after)
                new_inner = inner.with_changes(value=value.with_changes(elements=elements))
                return config.with_changes(elements=[new_inner if e is inner else e for e in config.elements])
            return None
        if isinstance(config, cst.Call) and (get_full_name_for_node(config.func) or "").endswith("AcceleratorConfig"):
            if any(arg.star for arg in config.args):
                return None
            kwargs = argument_of(config, "gradient_accumulation_kwargs", None)
            if kwargs is None:
                new = cst.Arg(
                    keyword=cst.Name("gradient_accumulation_kwargs"),
                    value=cst.parse_expression('{"sync_each_batch": True}'),
                    equal=cst.AssignEqual(
                        whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
                    ),
                )
                return config.with_changes(args=_append(config.args, new, config.whitespace_before_args))
            if isinstance(kwargs, cst.Dict) and all(isinstance(e, cst.DictElement) for e in kwargs.elements):
                elements = _append(kwargs.elements, sync, kwargs.lbrace.whitespace_after)
                new_kwargs = kwargs.with_changes(elements=elements)
                return config.with_changes(
                    args=[a.with_changes(value=new_kwargs) if a.value is kwargs else a for a in config.args]
                )
        return None

    # -- raw FSDP1 and FSDP2 ------------------------------------------------------------------

    def _raw_fsdp1(self) -> None:
        facts = self.facts
        wrappers = facts.wrapped_models()
        fsdp_in_file = any(facts.callee_is(c, RAW_FSDP1) for c in wrappers)
        ddp_in_file = any(facts.callee_is(c, DDP_WRAPPERS) for c in wrappers)
        for block in self.loop.no_sync_blocks:
            if block.kind != "model" or block.model is None:
                continue
            kinds = set()
            for origin in facts.origins(block.model, block.call):
                node = origin.node
                if isinstance(node, cst.Call) and facts.callee_is(node, RAW_FSDP1):
                    kinds.add("none" if _no_shard(node, self.context.module) else "fsdp")
                elif isinstance(node, cst.Call) and facts.callee_is(node, DDP_WRAPPERS):
                    kinds.add("ddp")
                else:
                    kinds.add("unknown")
            if kinds == {"fsdp"} or (kinds == {"unknown"} and fsdp_in_file and not ddp_in_file):
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
        if not any(self.facts.callee_is(call, RAW_FSDP2) for call in self.facts.wrapped_models()):
            return
        for node in self.loop.sync_toggles:
            if not isinstance(node, cst.Call) or self.facts.method_name(node) != "set_requires_gradient_sync":
                continue
            flag = argument_of(node, "requires_gradient_sync", 0)
            if flag is None or _literal_truth(flag) is True:
                continue
            self.report(
                node,
                "`set_requires_gradient_sync` turns off FSDP2's reduce-scatter, so every rank accumulates the full, "
                f"unsharded gradients of the module until it is turned back on ({DOCS}); when memory is tight, keep "
                "gradient sync on for every micro-batch (one reduce-scatter each: less memory, slower)",
            )


# -- small helpers ----------------------------------------------------------------------------------


def _receiver(call: cst.Call) -> cst.BaseExpression | None:
    return call.func.value if isinstance(call.func, cst.Attribute) else None


def _literal_true(expr: cst.BaseExpression | None) -> bool:
    return isinstance(expr, cst.Name) and expr.value == "True"


def _is_none(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Name) and expr.value == "None"


def _literal_truth(expr: cst.BaseExpression) -> bool | None:
    """Python truth of a literal (``True``, ``"full_shard"``, ``[...]``); None for anything else."""
    if isinstance(expr, cst.Name) and expr.value in {"True", "False", "None"}:
        return expr.value == "True"
    if isinstance(expr, cst.SimpleString):
        return bool(expr.evaluated_value)
    if isinstance(expr, cst.Integer):
        return int(expr.evaluated_value) != 0
    if isinstance(expr, (cst.List, cst.Tuple)):
        return bool(expr.elements)
    return None


def _literal_one(expr: cst.BaseExpression, facts, at: cst.CSTNode) -> bool:
    """The accumulation is the literal 1 (or 0), directly or through a name bound only to it."""
    if isinstance(expr, cst.Integer):
        return int(expr.evaluated_value) <= 1
    if isinstance(expr, cst.Name):
        origins = facts.origins(expr, at)
        return bool(origins) and all(
            isinstance(o.node, cst.Integer) and int(o.node.evaluated_value) <= 1 for o in origins
        )
    return False


def _no_shard(call: cst.Call, module: cst.Module) -> bool:
    """``FullyShardedDataParallel(..., sharding_strategy=ShardingStrategy.NO_SHARD)``: gradients are never sharded."""
    strategy = argument_of(call, "sharding_strategy", 2)
    return strategy is not None and module.code_for_node(strategy).endswith("NO_SHARD")


def _sync_each_batch_in(config: cst.CSTNode) -> bool | None:
    """Whether an ``accelerator_config`` value (a dict literal or ``AcceleratorConfig(...)``) sets
    ``sync_each_batch``; None when it cannot be told from the literal."""
    if isinstance(config, cst.Dict):
        if any(not isinstance(e, cst.DictElement) for e in config.elements):
            return None
        inner = next((e.value for e in config.elements if _string_key(e) == "gradient_accumulation_kwargs"), None)
    elif isinstance(config, cst.Call) and (get_full_name_for_node(config.func) or "").endswith("AcceleratorConfig"):
        if any(arg.star for arg in config.args):
            return None
        inner = argument_of(config, "gradient_accumulation_kwargs", None)
    else:
        return None
    if inner is None or _is_none(inner):
        return False
    if not isinstance(inner, cst.Dict) or any(not isinstance(e, cst.DictElement) for e in inner.elements):
        return None
    # any value counts: `"sync_each_batch": False` written out is the author's decision
    return any(_string_key(e) == "sync_each_batch" for e in inner.elements)


def _string_key(element: cst.DictElement) -> str | None:
    return element.key.evaluated_value if isinstance(element.key, cst.SimpleString) else None


def _equal_like(arg: cst.Arg) -> cst.AssignEqual | cst.MaybeSentinel:
    return arg.equal if isinstance(arg.equal, cst.AssignEqual) else cst.MaybeSentinel.DEFAULT


def _indent(opening: cst.BaseParenthesizableWhitespace, items) -> cst.SimpleWhitespace | None:
    """The indentation of the items of a bracket written one per line; None when they sit on one line."""
    if isinstance(opening, cst.ParenthesizedWhitespace):
        return opening.last_line
    for item in items[:-1]:
        comma = item.comma
        if isinstance(comma, cst.Comma) and isinstance(comma.whitespace_after, cst.ParenthesizedWhitespace):
            return comma.whitespace_after.last_line
    return None


def _append(items, new, opening: cst.BaseParenthesizableWhitespace) -> list:
    """``items`` (call arguments or dict elements) with ``new`` after the last one, in the bracket's layout."""
    items = list(items)
    if not items:
        return [new]
    last = items[-1]
    indent = _indent(opening, items)
    closing = getattr(last, "whitespace_after_arg", None)
    if isinstance(last.comma, cst.Comma):  # a trailing comma stays trailing
        after = last.comma.whitespace_after
        if indent is not None and isinstance(after, cst.ParenthesizedWhitespace):
            between = cst.Comma(
                whitespace_before=last.comma.whitespace_before,
                whitespace_after=after.with_changes(last_line=indent),
            )
            trailing = cst.Comma(whitespace_after=cst.ParenthesizedWhitespace(last_line=after.last_line))
            return [*items[:-1], last.with_changes(comma=between), new.with_changes(comma=trailing)]
        between = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        return [*items[:-1], last.with_changes(comma=between), new.with_changes(comma=last.comma)]
    if indent is not None and isinstance(closing, cst.ParenthesizedWhitespace):
        between = cst.Comma(whitespace_after=closing.with_changes(last_line=indent))
        moved = last.with_changes(comma=between, whitespace_after_arg=cst.SimpleWhitespace(""))
        return [*items[:-1], moved, new.with_changes(whitespace_after_arg=closing)]
    if indent is not None and closing is None:  # a dict one per line: the break before `}` belongs to the brace
        between = cst.Comma(whitespace_after=cst.ParenthesizedWhitespace(last_line=indent))
        return [*items[:-1], last.with_changes(comma=between), new]
    between = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    if closing is not None:
        moved = last.with_changes(comma=between, whitespace_after_arg=cst.SimpleWhitespace(""))
        return [*items[:-1], moved, new.with_changes(whitespace_after_arg=closing)]
    return [*items[:-1], last.with_changes(comma=between), new]


def _insert_after(args, index: int, new: cst.Arg, opening: cst.BaseParenthesizableWhitespace) -> list:
    """Call arguments with ``new`` right after ``args[index]``, in the call's layout."""
    args = list(args)
    if index == len(args) - 1:
        return _append(args, new, opening)
    before = args[index]
    comma = before.comma
    if isinstance(comma, cst.Comma) and isinstance(comma.whitespace_after, cst.ParenthesizedWhitespace):
        # the comment after `before` stays on its line; the new argument gets a plain line break
        comma_new = comma.with_changes(
            whitespace_after=comma.whitespace_after.with_changes(first_line=cst.TrailingWhitespace())
        )
        return [*args[: index + 1], new.with_changes(comma=comma_new), *args[index + 1 :]]
    return [*args[: index + 1], new.with_changes(comma=comma), *args[index + 1 :]]
