"""The training loop as facts: backward sites, optimizer steps and their gates, accumulation, and the loss.

Every rule about accumulation, backward or the loss asks the same questions of a script:
where the backward passes are and what they differentiate, where the optimizer steps and
what gates it, which ``accumulate``/``no_sync`` blocks hold them, what accumulation the
Accelerator, its plugin or the launch configure, and how a loss was reduced and normalised.
They are answered here once per file, from the facts' indexes (no new walk of the module),
and memoised on first use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import (
    ACCELERATOR_CLASSES,
    BACKWARD_METHODS,
    DDP_CLASSES,
    DISTRIBUTED_CALLS,
    FABRIC_CLASSES,
    PythonFacts,
    argument_of,
)

GA_PLUGIN_CLASSES = frozenset(
    {
        "accelerate.utils.GradientAccumulationPlugin",
        "accelerate.utils.dataclasses.GradientAccumulationPlugin",
        "accelerate.accelerator.GradientAccumulationPlugin",
    }
)
DEEPSPEED_PLUGINS = frozenset(
    {"accelerate.DeepSpeedPlugin", "accelerate.utils.DeepSpeedPlugin", "accelerate.utils.dataclasses.DeepSpeedPlugin"}
)
DEEPSPEED_CALLS = DEEPSPEED_PLUGINS | frozenset({"deepspeed.initialize"})
FSDP_PLUGINS = frozenset(
    {
        "accelerate.FullyShardedDataParallelPlugin",
        "accelerate.utils.FullyShardedDataParallelPlugin",
        "accelerate.utils.dataclasses.FullyShardedDataParallelPlugin",
    }
)
GRAD_SYNC = frozenset({"lintdist.runtime.grad_sync", "lintdist.runtime.sync.grad_sync"})
TORCH_BACKWARD = frozenset({"torch.autograd.backward"})
TORCH_CLIPS = frozenset(
    {
        "torch.nn.utils.clip_grad_norm_",
        "torch.nn.utils.clip_grad_value_",
        "torch.nn.utils.clip_grad.clip_grad_norm_",
        "torch.nn.utils.clip_grad.clip_grad_value_",
    }
)
CE_MODULES = frozenset(
    {
        "torch.nn.CrossEntropyLoss",
        "torch.nn.NLLLoss",
        "torch.nn.modules.loss.CrossEntropyLoss",
        "torch.nn.modules.loss.NLLLoss",
    }
)
CE_FUNCTIONS = frozenset({"torch.nn.functional.cross_entropy", "torch.nn.functional.nll_loss", "torch.cross_entropy"})
# Calls that start the job's processes from inside the script.
SPAWNS = frozenset(
    {"torch.multiprocessing.spawn", "accelerate.notebook_launcher", "accelerate.launchers.notebook_launcher"}
)
# Calls that start processes or a process group without averaging anything.
GROUP_ONLY_CALLS = frozenset({"torch.distributed.init_process_group", "torch.multiprocessing.spawn"})
# Collators that pad or mask labels with -100: the loss averages over a varying number of tokens.
TOKEN_COLLATORS = frozenset(
    {
        "DataCollatorForLanguageModeling",
        "DataCollatorForSeq2Seq",
        "DataCollatorForTokenClassification",
        "DataCollatorForWholeWordMask",
        "DataCollatorForCompletionOnlyLM",
    }
)
CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")
TOKEN_SUFFIXES = ("ForMaskedLM", "ForSeq2SeqLM", "ForTokenClassification")
# Encoder-decoder `*ForConditionalGeneration` classes whose loss is the token mean of the unshifted decoder labels
# (transformers 5.23: the decoder input is the labels shifted right). Vision-language `*ForConditionalGeneration`
# classes (LLaVA, PaliGemma, ...) shift like a causal LM and are not listed.
SEQ2SEQ_GENERATION = frozenset(
    f"{family}ForConditionalGeneration"
    for family in (
        "T5",
        "MT5",
        "UMT5",
        "LongT5",
        "Bart",
        "MBart",
        "Pegasus",
        "PegasusX",
        "BigBirdPegasus",
        "M2M100",
        "NllbMoe",
        "Blenderbot",
        "BlenderbotSmall",
        "LED",
        "ProphetNet",
        "FSMT",
        "Whisper",
        "Speech2Text",
        "SwitchTransformers",
        "PLBart",
        "Mvp",
    )
) | {"MarianMTModel"}
# Heads with one target (or one answer span) per example: their batch mean is over examples, not over tokens,
# however much `-100` the rest of the file uses (QA scripts pad gathered logits with it).
SEQUENCE_SUFFIXES = (
    "ForSequenceClassification",
    "ForMultipleChoice",
    "ForQuestionAnswering",
    "ForImageClassification",
    "ForAudioClassification",
    "ForVideoClassification",
    "ForNextSentencePrediction",
)
GATHER_METHODS = frozenset({"gather", "reduce", "all_reduce", "all_gather", "gather_for_metrics", "global_token_count"})
COUNT_NAME_HINTS = ("num_items", "num_tokens", "n_tokens", "ntokens", "token_count", "total_items", "num_valid")
WINDOW_METHODS = frozenset({"scale_mean", "scale_sum"})
SCHEDULER_FACTORIES = ("get_scheduler", "schedule", "lr_scheduler", "LambdaLR", "StepLR", "CosineAnnealing", "OneCycle")
MAX_WALK = 12
WRAPPER_MARKERS = ("DistributedDataParallel", "FullyShardedDataParallel", "fully_shard", "DDP(", "FSDP(")
MAX_DEPTH = 6
PREPARE_MODEL_METHODS = frozenset({"prepare", "prepare_model"})
# Calls that hand back the model they are called on (or its parameters' owner): `model.to(device)`, `.train()`...
SAME_MODEL_METHODS = frozenset({"to", "cuda", "cpu", "train", "eval", "float", "half", "bfloat16", "double"})
UNWRAP_METHODS = frozenset({"unwrap_model"})
# Functions that return a wrapper which runs and holds the model they are given: `torch.compile(model)`.
WRAPPING_FUNCTIONS = frozenset({"torch.compile"})
PARAMETER_METHODS = frozenset({"parameters", "named_parameters"})
DETACHING = frozenset({"detach", "item", "tolist", "numpy"})


# -- what the loop is made of -------------------------------------------------------------------


@dataclass(frozen=True)
class BackwardSite:
    """One backward pass: ``loss.backward()`` ("tensor"), ``accelerator.backward(loss)`` ("accelerator"),
    ``fabric.backward(loss)`` ("fabric"), ``self.manual_backward(loss)`` ("manual"),
    ``scaler.scale(loss).backward()`` ("scaler"), ``torch.autograd.backward(loss)`` ("autograd"), or
    ``engine.backward(loss)`` of an object lintdist cannot name ("engine")."""

    call: cst.Call
    kind: str
    loss: cst.BaseExpression | None
    receiver: cst.BaseExpression | None  # the accelerator, fabric, module, scaler or engine whose method it is


@dataclass(frozen=True)
class Gate:
    """The ``if`` around a step, and what it tests: "modulo" (``(step + 1) % k == 0``), "sync_gradients"
    (``if accelerator.sync_gradients:``) or "counter" (``if micro_step == accum_steps:``)."""

    node: cst.If
    kind: str


@dataclass(frozen=True)
class StepSite:
    """``optimizer.step()`` / ``scaler.step(optimizer)`` ("optimizer"), ``scheduler.step()`` ("scheduler"),
    ``*.zero_grad()`` ("zero_grad"), or a gradient clip ("clip": ``torch.nn.utils.clip_grad_norm_(...)`` or
    ``accelerator.clip_grad_norm_(...)``)."""

    call: cst.Call
    kind: str
    receiver: cst.BaseExpression | None
    gate: Gate | None


@dataclass(frozen=True)
class AccumulateBlock:
    """``with accelerator.accumulate(model, ...):``."""

    node: cst.With
    call: cst.Call
    accelerator: cst.BaseExpression
    models: tuple[cst.BaseExpression, ...]


@dataclass(frozen=True)
class NoSync:
    """A block that skips the gradient all-reduce: ``model.no_sync()`` ("model"), ``accelerator.no_sync(model)``
    ("accelerator"), ``grad_sync(model, sync=...)`` of ``lintdist.runtime`` ("grad_sync") or
    ``fabric.no_backward_sync(model)`` ("fabric"). ``call`` is the context expression's call: in the ``with``
    itself, or in the assignment of the name it enters (``with context:``)."""

    node: cst.With
    call: cst.Call
    kind: str
    model: cst.BaseExpression | None


@dataclass(frozen=True)
class AccumulationLoop:
    """nanoGPT's accumulation window: ``for micro_step in range(accum_steps):`` around the backward, and the
    optimizer step that runs after it, ungated, in the loop around it (``outer``; None: the function is called once
    per step)."""

    node: cst.For
    bound: cst.BaseExpression  # ``accum_steps``
    step: StepSite
    outer: cst.For | cst.While | None


@dataclass(frozen=True)
class Accumulation:
    """What lintdist knows of an Accelerator's gradient accumulation steps.

    ``state`` is "configured" (the code, its plugin or the launch sets more than one step), "unknown" (nothing sets
    it, but the script opens ``accumulate`` blocks: ``accelerate launch`` may set it) or "none" (one step).
    ``value`` is the number when a literal says it; ``expr`` the expression the code configures it with.
    """

    state: str
    value: int | None = None
    expr: cst.BaseExpression | None = None


@dataclass(frozen=True)
class Term:
    """A factor of the loss (``expr``) and the statement it appears in."""

    expr: cst.BaseExpression
    at: cst.CSTNode


@dataclass
class Chain:
    """A loss as base x product(num) / product(den)."""

    base: str | None = None  # "mean", "sum", "tokens" (unreduced), "window" (already scaled), "other"
    base_expr: cst.BaseExpression | None = None
    base_at: cst.CSTNode | None = None
    num: list[Term] = field(default_factory=list)
    den: list[Term] = field(default_factory=list)
    # The base is a mean only by assumption: an imported loss helper that lintdist cannot read, given token labels.
    assumed: bool = False

    def set_base(self, kind: str, expr: cst.BaseExpression, at: cst.CSTNode) -> None:
        if self.base is not None:
            kind = "other"  # two losses multiplied or divided: not a recipe lintdist understands
        self.base, self.base_expr, self.base_at = kind, expr, at


@dataclass(frozen=True)
class Division:
    """A division of the loss by the accumulation steps: the divisor ``term``, and whether it is
    ``accelerator.gradient_accumulation_steps`` itself (then it is exactly what accelerate divides by)."""

    term: Term
    exact: bool


@dataclass(frozen=True)
class Factor:
    """What a factor of the loss is: a token "count", the "world" size, "accum" steps, or "other"."""

    kind: str
    gathered: bool = False
    shifted: bool = False
    literal: int | None = None


# -- the model --------------------------------------------------------------------------------


class TrainingLoop:
    """The training-loop facts of one file; ``TrainingLoop.of(context)`` builds them once per file."""

    def __init__(self, facts: PythonFacts, settings=None, launch=None) -> None:
        self.facts = facts
        self.settings = settings
        self.launch = launch  # ``lintdist.launch.Launch``: how the script is launched, where known
        self._roles: dict[int, str | None] = {}
        self._heads: dict[int, str | None] = {}
        self._factors: dict[int, Factor] = {}
        self._totals: dict[str, list[cst.AugAssign]] | None = None

    @classmethod
    def of(cls, context) -> TrainingLoop:
        facts = context.facts
        loop = facts._memo.get("loop")
        if loop is None:
            from lintdist.launch import script_launch

            loop = facts._memo["loop"] = cls(facts, context.settings, script_launch(context))
        return loop

    # -- backward passes ---------------------------------------------------------------------

    @cached_property
    def backward_sites(self) -> list[BackwardSite]:
        return [site for call in self.facts.calls if (site := self._backward_site(call)) is not None]

    def backward_site(self, call: cst.Call) -> BackwardSite | None:
        return self._backward_by_call.get(id(call))

    @cached_property
    def _backward_by_call(self) -> dict[int, BackwardSite]:
        return {id(site.call): site for site in self.backward_sites}

    def _backward_site(self, call: cst.Call) -> BackwardSite | None:
        facts = self.facts
        func = call.func
        if _may_be(facts, func, "backward") and facts.callee_is(call, TORCH_BACKWARD):
            return BackwardSite(call, "autograd", _first_positional(call), None)
        if not isinstance(func, cst.Attribute) or func.attr.value not in BACKWARD_METHODS:
            return None
        receiver = func.value
        if func.attr.value == "manual_backward":
            return BackwardSite(call, "manual", _first_positional(call), receiver)
        loss = _first_positional(call)
        if loss is None:
            if _is_method_call(receiver, "scale"):
                return BackwardSite(call, "scaler", _first_positional(receiver), receiver.func.value)
            return BackwardSite(call, "tensor", receiver, None)
        if facts.is_accelerator(receiver, call):
            return BackwardSite(call, "accelerator", loss, receiver)
        if any(
            isinstance(o.node, cst.Call) and facts.callee_is(o.node, FABRIC_CLASSES)
            for o in facts.origins(receiver, call)
        ):
            return BackwardSite(call, "fabric", loss, receiver)
        return BackwardSite(call, "engine", loss, receiver)

    def statement_of(self, node: cst.CSTNode) -> cst.BaseSmallStatement | None:
        """The small statement (``x = ...``, an expression statement...) that holds ``node``."""
        return next((a for a in self.facts.ancestors(node) if isinstance(a, cst.BaseSmallStatement)), None)

    # -- optimizer, scheduler, zero_grad and clip steps ----------------------------------------

    @cached_property
    def steps(self) -> list[StepSite]:
        result = []
        for call in self.facts.calls:
            kind, receiver = self._step_kind(call)
            if kind is not None:
                result.append(StepSite(call, kind, receiver, self.gate_of(call)))
        return result

    def _step_kind(self, call: cst.Call) -> tuple[str | None, cst.BaseExpression | None]:
        facts = self.facts
        if _may_be(facts, call.func, "clip_grad_norm_", "clip_grad_value_") and facts.callee_is(call, TORCH_CLIPS):
            return "clip", None
        func = call.func
        if not isinstance(func, cst.Attribute):
            return None, None
        method, receiver = func.attr.value, func.value
        if method in {"clip_grad_norm_", "clip_grad_value_"}:
            return "clip", receiver
        if method == "zero_grad":
            return "zero_grad", receiver
        if method != "step":
            return None, None
        if call.args and self.role(call.args[0].value, call) == "optimizer":
            return "optimizer", receiver  # scaler.step(optimizer)
        role = self.role(receiver, call)
        return (role, receiver) if role in {"optimizer", "scheduler"} else (None, None)

    def role(self, expr: cst.BaseExpression, at: cst.CSTNode) -> str | None:
        """ "optimizer" or "scheduler" for an expression holding one, by its name or where it was built."""
        key = id(expr)
        if key not in self._roles:
            self._roles[key] = None
            self._roles[key] = self._role(expr, at, 0)
        return self._roles[key]

    def _role(self, expr: cst.BaseExpression, at: cst.CSTNode, depth: int) -> str | None:
        name = (get_full_name_for_node(expr) or "").rsplit(".", 1)[-1].lower()
        if "sched" in name:
            return "scheduler"
        if "optim" in name or name in {"opt", "opt_g", "opt_d", "g_opt", "d_opt"} or name.startswith("opt_"):
            return "optimizer"
        if depth > 2:
            return None
        facts = self.facts
        for origin in facts.origins(expr, at):
            node = origin.node
            if not isinstance(node, cst.Call):
                continue
            if facts.is_prepare_call(node):
                argument = argument_of(node, "", origin.index or 0)
                found = self._role(argument, node, depth + 1) if argument is not None else None
            else:
                names = facts.qualified_names(node.func) | {get_full_name_for_node(node.func) or ""}
                found = None
                for qualified in names:
                    last = qualified.rsplit(".", 1)[-1]
                    if qualified.startswith("torch.optim.lr_scheduler") or any(
                        part in qualified for part in SCHEDULER_FACTORIES
                    ):
                        found = "scheduler"
                    elif qualified.startswith("torch.optim.") or last.endswith("Optimizer"):
                        found = "optimizer"
            if found is not None:
                return found
        return None

    def gate_of(self, node: cst.CSTNode) -> Gate | None:
        """The innermost accumulation gate around ``node`` in its function."""
        for ancestor in self.facts.ancestors(node):
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                return None
            if isinstance(ancestor, cst.If):
                kind = self._gate_kind(ancestor.test)
                if kind is not None:
                    return Gate(ancestor, kind)
        return None

    def _gate_kind(self, test: cst.BaseExpression) -> str | None:
        facts = self.facts
        for node in facts.within(test, cst.Attribute, cst.BinaryOperation, cst.Name):
            if isinstance(node, cst.Attribute) and node.attr.value == "sync_gradients":
                return "sync_gradients"
        for node in facts.within(test, cst.BinaryOperation):
            if isinstance(node.operator, cst.Modulo) and _mentions_accumulation(facts, node.right):
                return "modulo"
        if isinstance(test, cst.Comparison) and any(
            _mentions_accumulation(facts, part) for part in (test.left, *(c.comparator for c in test.comparisons))
        ):
            return "counter"
        return None

    # -- accumulation ---------------------------------------------------------------------------

    @cached_property
    def accumulate_blocks(self) -> list[AccumulateBlock]:
        """``with accelerator.accumulate(...)`` blocks; ``with (acc.accumulate(a), acc.accumulate(b))`` is one block
        of two models."""
        facts = self.facts
        blocks: dict[int, AccumulateBlock] = {}
        for call in facts.calls:
            if not _is_method_call(call, "accumulate"):
                continue
            item = facts.parent(call)
            block = facts.parent(item) if isinstance(item, cst.WithItem) else None
            if not isinstance(block, cst.With) or not self._accumulating_accelerator(call.func.value, call):
                continue
            models = tuple(arg.value for arg in call.args if not arg.star and arg.keyword is None)
            known = blocks.get(id(block))
            if known is not None:
                blocks[id(block)] = AccumulateBlock(block, known.call, known.accelerator, known.models + models)
            else:
                blocks[id(block)] = AccumulateBlock(block, call, call.func.value, models)
        return list(blocks.values())

    def _accumulating_accelerator(self, receiver: cst.BaseExpression, call: cst.Call) -> bool:
        """The receiver of ``x.accumulate(...)`` holds an Accelerator; or, in a file that builds exactly one, its
        name ends in ``accelerator`` (a closure reading the enclosing function's, which ``origins`` does not
        follow: accelerate's ``automatic_gradient_accumulation.py``)."""
        if self.facts.is_accelerator(receiver, call):
            return True
        name = (get_full_name_for_node(receiver) or "").rsplit(".", 1)[-1]
        return name.endswith("accelerator") and len(self.accelerators) == 1

    def accumulate_block_of(self, node: cst.CSTNode) -> AccumulateBlock | None:
        """The innermost ``accumulate`` block whose body holds ``node`` (in the same function)."""
        return _innermost(self.facts, node, {id(b.node): b for b in self.accumulate_blocks})

    @cached_property
    def no_sync_blocks(self) -> list[NoSync]:
        """The blocks that skip the gradient all-reduce: ``with model.no_sync():``, ``with ctx():`` for ``ctx =
        model.no_sync if c else nullcontext``, and ``with context:`` for ``context = nullcontext() if last else
        model.no_sync()`` (or ``grad_sync(...)``, ``accelerator.no_sync(model)``)."""
        facts = self.facts
        result = []
        for block in facts.index.nodes(cst.With):
            for item in block.items:
                expr = item.item
                if isinstance(expr, cst.Call):
                    found = self._no_sync(expr)
                    if found is not None:
                        result.append(NoSync(block, expr, *found))
                elif isinstance(expr, (cst.Name, cst.Attribute)):
                    for origin in facts.origins(expr, block):
                        found = self._no_sync(origin.node) if isinstance(origin.node, cst.Call) else None
                        if found is not None:
                            result.append(NoSync(block, origin.node, *found))
                            break
        return result

    def no_sync_of(self, node: cst.CSTNode) -> NoSync | None:
        """The innermost ``no_sync``-like block whose body holds ``node`` (in the same function)."""
        return _innermost(self.facts, node, self._no_sync_by_block)

    @cached_property
    def _no_sync_by_block(self) -> dict[int, NoSync]:
        """The no_sync-like blocks by their ``with`` node."""
        return {id(b.node): b for b in self.no_sync_blocks}

    def _no_sync(self, call: cst.Call) -> tuple[str, cst.BaseExpression | None] | None:
        facts = self.facts
        if facts.callee_is(call, GRAD_SYNC):
            return "grad_sync", argument_of(call, "model", 0)
        func = call.func
        if isinstance(func, cst.Attribute):
            if func.attr.value == "no_backward_sync":
                return "fabric", _first_positional(call)
            if func.attr.value == "no_sync":
                if facts.is_accelerator(func.value, call):
                    return "accelerator", argument_of(call, "model", 0)
                return "model", func.value
            return None
        if isinstance(func, cst.Name):
            # `ctx = model.no_sync if not last else nullcontext` ... `with ctx():`
            for origin in facts.origins(func, call):
                node = origin.node
                options = (node.body, node.orelse) if isinstance(node, cst.IfExp) else (node,)
                for option in options:
                    if isinstance(option, cst.Attribute) and option.attr.value == "no_sync":
                        if facts.is_accelerator(option.value, call):
                            return "accelerator", None
                        return "model", option.value
        return None

    def accumulation_loop(self, node: cst.CSTNode) -> AccumulationLoop | None:
        """The accumulation window ``node`` runs in: the innermost ``for i in range(<accumulation steps>)`` around it
        in its function (not of the literal 1), with an ungated optimizer step after that loop."""
        facts = self.facts
        inner = self._accumulation_for(node)
        if inner is None:
            return None
        order, end = facts.index.order, facts.index.end
        outer = facts.enclosing_loop(inner)
        function = facts.enclosing_function(inner)
        for step in self.steps:
            if (
                step.kind == "optimizer"
                and step.gate is None
                and facts.enclosing_function(step.call) is function
                and order(step.call) >= end(inner)
                and (outer is None or facts.is_within(step.call, outer.body))
            ):
                return AccumulationLoop(inner, range_bound(facts, inner), step, outer)
        return None

    def _accumulation_for(self, node: cst.CSTNode) -> cst.For | None:
        """The innermost ``for i in range(<accumulation steps>)`` around ``node`` in its function (not of 1)."""
        facts = self.facts
        for ancestor in facts.ancestors(node):
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                return None
            if not isinstance(ancestor, cst.For) or not facts.is_within(node, ancestor.body):
                continue
            bound = range_bound(facts, ancestor)
            if bound is not None and _mentions_accumulation(facts, bound):
                return None if integer_literal(bound, facts, ancestor) == 1 else ancestor
        return None

    @cached_property
    def sync_toggles(self) -> list[cst.CSTNode]:
        """``ddp.require_backward_grad_sync = flag`` and ``model.set_requires_gradient_sync(flag)`` (FSDP2)."""
        result: list[cst.CSTNode] = []
        for assign in self.facts.index.nodes(cst.Assign):
            if any(_is_attribute(t.target, "require_backward_grad_sync") for t in assign.targets):
                result.append(assign)
        result.extend(c for c in self.facts.calls if _is_method_call(c, "set_requires_gradient_sync"))
        return result

    @cached_property
    def accelerators(self) -> list[cst.Call]:
        """``Accelerator(...)`` constructions."""
        return self.facts.accelerator_constructions

    @cached_property
    def accumulation_plugins(self) -> list[cst.Call]:
        """``GradientAccumulationPlugin(...)`` constructions."""
        return [c for c in self.facts.calls if self.facts.callee_is(c, GA_PLUGIN_CLASSES)]

    def configured_accumulation(self, accelerator_call: cst.Call) -> cst.BaseExpression | None:
        """``Accelerator(gradient_accumulation_steps=X)`` or its plugin's ``num_steps``; None when it is 1 or unset."""
        facts = self.facts
        steps = argument_of(accelerator_call, "gradient_accumulation_steps", None)
        plugin = argument_of(accelerator_call, "gradient_accumulation_plugin", None)
        if steps is None and plugin is not None:
            for origin in facts.origins(plugin, accelerator_call):
                if isinstance(origin.node, cst.Call) and facts.callee_is(origin.node, GA_PLUGIN_CLASSES):
                    steps = argument_of(origin.node, "num_steps", None)
        if steps is None or (isinstance(steps, cst.Integer) and steps.evaluated_value == 1):
            return None
        return steps

    def accelerator_accumulation(self, accelerator: cst.BaseExpression, at: cst.CSTNode) -> cst.BaseExpression | None:
        """The accumulation steps the Accelerator behind ``accelerator`` was built with (None: not set in code)."""
        for origin in self.facts.origins(accelerator, at):
            if isinstance(origin.node, cst.Call) and self.facts.callee_is(origin.node, ACCELERATOR_CLASSES):
                return self.configured_accumulation(origin.node)
        return None

    @cached_property
    def _launch_steps(self):
        """The launch's ``gradient_accumulation_steps`` Setting that reaches the Accelerator, of any value: the
        ``ACCELERATE_GRADIENT_ACCUMULATION_STEPS`` variable, or under a DeepSpeed launch also the flag and the
        DeepSpeed config's key (``accelerate launch`` exports those only in ``prepare_deepspeed_cmd_env``)."""
        settings = self.settings
        setting = settings.get("gradient_accumulation_steps") if settings is not None else None
        if setting is None or setting.spelling == "env":
            return setting
        backend = settings.distributed_type
        return setting if backend is not None and str(backend.value).upper() == "DEEPSPEED" else None

    @cached_property
    def launch_accumulation(self):
        """``gradient_accumulation_steps`` from the launch (env; under DeepSpeed also the flag or the DeepSpeed
        config), as a Setting, if > 1."""
        setting = self._launch_steps
        if setting is None:
            return None
        value = str(setting.value).strip()
        return setting if not value.isdigit() or int(value) > 1 else None

    def accumulation(self, accelerator: cst.BaseExpression | None, at: cst.CSTNode) -> Accumulation:
        """The accumulation of the Accelerator behind ``accelerator`` (the file's only one when it cannot be named).

        The launch wins over the code, as in accelerate: ``ACCELERATE_GRADIENT_ACCUMULATION_STEPS`` (which a
        DeepSpeed ``accelerate launch`` sets from its flag or config) overrides the keyword, and a DeepSpeed config's
        value overrides both.
        """
        facts = self.facts
        calls: list[cst.Call] = []
        if accelerator is not None:
            calls = [
                o.node
                for o in facts.origins(accelerator, at)
                if isinstance(o.node, cst.Call) and facts.callee_is(o.node, ACCELERATOR_CLASSES)
            ]
        if not calls and len(self.accelerators) == 1:
            calls = list(self.accelerators)
        setting = self._launch_steps
        if setting is not None and str(setting.value).strip().isdigit():
            value = int(str(setting.value).strip())
            return Accumulation("configured", value) if value > 1 else Accumulation("none")
        if setting is not None:
            return Accumulation("unknown")
        for call in calls:
            steps = self.configured_accumulation(call)
            if steps is not None:
                return Accumulation("configured", integer_literal(steps, facts, call), steps)
        if calls and all(self._one_step(call) for call in calls):
            return Accumulation("none")
        blocks = [b for b in self.accumulate_blocks if accelerator is None or _same_name(b.accelerator, accelerator)]
        return Accumulation("unknown") if blocks or self._windows_on_own_steps(accelerator) else Accumulation("none")

    def _windows_on_own_steps(self, accelerator: cst.BaseExpression | None) -> bool:
        """The loop counts its window with the Accelerator's own steps
        (``step % accelerator.gradient_accumulation_steps``): the code means them to be more than 1, wherever they
        are set."""
        if accelerator is None:
            return False
        for operation in self.facts.index.nodes(cst.BinaryOperation):
            right = operation.right
            if (
                isinstance(operation.operator, cst.Modulo)
                and isinstance(right, cst.Attribute)
                and right.attr.value == "gradient_accumulation_steps"
                and _same_name(right.value, accelerator)
            ):
                return True
        return False

    def _one_step(self, call: cst.Call) -> bool:
        """``Accelerator(gradient_accumulation_steps=1)``, or a plugin with ``num_steps=1`` or without ``num_steps``
        (accelerate then keeps 1). An Accelerator built with neither is not: the launch may set the steps."""
        facts = self.facts
        steps = argument_of(call, "gradient_accumulation_steps", None)
        plugin = argument_of(call, "gradient_accumulation_plugin", None)
        if steps is not None:
            return isinstance(steps, cst.Integer) and int(steps.value) == 1
        if plugin is None:
            return False
        for origin in facts.origins(plugin, call):
            node = origin.node
            if isinstance(node, cst.Call) and facts.callee_is(node, GA_PLUGIN_CLASSES):
                if any(arg.star for arg in node.args):
                    return False
                num = argument_of(node, "num_steps", 0)
                return num is None or (isinstance(num, cst.Integer) and int(num.value) == 1)
        return False

    @cached_property
    def accumulates(self) -> bool:
        """Gradients are accumulated over micro-batches: an ``accumulate`` or ``no_sync`` block, an accumulation
        plugin or keyword, a launch setting, or Lightning's ``accumulate_grad_batches`` > 1."""
        facts = self.facts
        if self.accumulate_blocks or self.no_sync_blocks or self.accumulation_plugins or self.launch_accumulation:
            return True
        if any(self.configured_accumulation(call) is not None for call in self.accelerators):
            return True
        for call in facts.lightning_trainers:
            steps = argument_of(call, "accumulate_grad_batches", None)
            if steps is not None and not (isinstance(steps, cst.Integer) and int(steps.value) <= 1):
                return True
        return False

    @cached_property
    def sync_each_batch(self) -> bool:
        """An accumulation plugin (or the Trainer's accelerator config) asks to sync every micro-batch."""
        facts = self.facts
        for node in facts.index.nodes(cst.Arg, cst.DictElement):
            key = node.keyword.value if isinstance(node, cst.Arg) and node.keyword else None
            if isinstance(node, cst.DictElement) and isinstance(node.key, cst.SimpleString):
                key = node.key.evaluated_value
            if key == "sync_each_batch" and not (isinstance(node.value, cst.Name) and node.value.value == "False"):
                return True
        return False

    @cached_property
    def accumulation_setters(self) -> list[tuple[cst.Assign, cst.Attribute]]:
        """``x.gradient_accumulation_steps = n`` (the Accelerator's property setter, which rewrites the gradient
        state's ``num_steps``), as (assignment, target); whether ``x`` holds an Accelerator is the reader's call."""
        return [
            (assign, target.target)
            for assign in self.facts.index.nodes(cst.Assign)
            for target in assign.targets
            if _is_attribute(target.target, "gradient_accumulation_steps")
        ]

    # -- the backend --------------------------------------------------------------------------

    @cached_property
    def backend(self) -> str | None:
        """ "DEEPSPEED" or "FSDP" when the code or the launch selects one; None otherwise (or unknown)."""
        facts = self.facts
        for call in facts.calls:
            if facts.callee_is(call, DEEPSPEED_CALLS):
                return "DEEPSPEED"
            if facts.callee_is(call, FSDP_PLUGINS):
                return "FSDP"
            if facts.callee_is(call, ACCELERATOR_CLASSES):
                keywords = {arg.keyword.value for arg in call.args if arg.keyword is not None}
                if keywords & {"deepspeed_plugin", "deepspeed_plugins"}:
                    return "DEEPSPEED"
                if "fsdp_plugin" in keywords:
                    return "FSDP"
        settings = self.settings
        backend = settings.distributed_type if settings is not None else None
        value = str(backend.value).upper() if backend is not None else ""
        return value if value in {"DEEPSPEED", "FSDP"} else None

    @cached_property
    def fsdp_version(self) -> int | None:
        """The FSDP version accelerate would run: a plugin's ``fsdp_version=`` (a literal, or a name bound to one),
        else the launch's ``fsdp_version`` (the plugin reads ``FSDP_VERSION``), else 1, accelerate's default; None
        when an expression lintdist cannot read decides."""
        facts = self.facts
        for call in facts.calls:
            if facts.callee_is(call, FSDP_PLUGINS):
                value = argument_of(call, "fsdp_version", None)
                if value is not None:
                    return integer_literal(value, facts, call)
        setting = self.settings.get("fsdp_version") if self.settings is not None else None
        if setting is not None:
            text = str(setting.value).strip()
            return int(text) if text.isdigit() else None
        return 1

    @cached_property
    def distributed(self) -> bool:
        """The script can run on several processes: a DDP/FSDP wrapper, an Accelerator, a process group..."""
        return self.facts.sets_up_processes()

    @cached_property
    def _averaging_calls(self) -> list[cst.Call]:
        """Calls that make ranks average gradients: a DDP/FSDP wrapper, an Accelerator, DeepSpeed or Fabric, or a
        hand-written ``all_reduce`` of ``.grad``. A process group alone does not (tensor parallelism, tests that run
        the same batch on every rank)."""
        facts = self.facts
        averaging = (ACCELERATOR_CLASSES | DISTRIBUTED_CALLS) - GROUP_ONLY_CALLS
        wrappers = {id(call) for call in facts.wrapped_models()}
        return [
            call
            for call in facts.calls
            if id(call) in wrappers
            or facts.callee_is(call, averaging)
            or (
                facts.method_name(call) in {"all_reduce", "reduce", "reduce_scatter"}
                and any(n.attr.value == "grad" for n in facts.within(call, cst.Attribute))
            )
            or facts.wraps_in_another_module(call, DDP_CLASSES, WRAPPER_MARKERS)
        ]

    def averages_gradients(self, node: cst.CSTNode) -> bool:
        """Gradients computed at ``node`` are averaged over ranks as far as this file tells: an averaging call at
        module level, in ``node``'s function, in a function that calls it (up to three levels), in a local helper
        those call, or in another method of its class (``self.model = DDP(...)`` in ``__init__``)."""
        facts = self.facts
        calls = self._averaging_calls
        if not calls:
            return False
        where = {id(facts.enclosing_function(call)) for call in calls}
        if id(None) in where:
            return True
        pending = [facts.enclosing_function(node)]
        seen: set[int] = set()
        for _ in range(4):
            following = []
            for function in pending:
                if function is None:
                    return True  # reached from module level, where the file's other code runs too
                if id(function) in seen:
                    continue
                seen.add(id(function))
                cls = facts.enclosing_class(function)
                scopes = [function]
                if cls is not None:
                    scopes += [f for f in facts.within(cls, cst.FunctionDef) if facts.enclosing_class(f) is cls]
                scopes += [h for f in scopes for c in facts.within(f, cst.Call) for h in facts.local_functions(c)]
                if any(id(f) in where for f in scopes):
                    return True
                following += [facts.enclosing_function(site) for site in facts.call_sites(function)]
            pending = following
        return False

    @cached_property
    def surely_distributed(self) -> bool:
        """Evidence of several processes beyond building an Accelerator: a DDP/FSDP wrapper, a process group,
        a spawn, or a launch that asks for more than one process."""
        facts = self.facts
        if bool(facts.wrapped_models()) or any(facts.callee_is(call, DISTRIBUTED_CALLS) for call in facts.calls):
            return True
        if self.launch is not None and self.launch.several_processes:
            return True  # `torchrun --nproc_per_node 8`, `mpiexec -n 2`, `mp.spawn(fn, nprocs=2)`
        processes = self.settings.get("num_processes") if self.settings else None
        return processes is not None and str(processes.value).strip().isdigit() and int(processes.value) > 1

    @cached_property
    def surely_single(self) -> bool:
        """The launch runs one process (`num_processes: 1`, `--num_processes 1`, a plain `python train.py`,
        `mpiexec -n 1` or `srun -n 1` line, `torchrun` with one process on one node) and the script starts no
        processes of its own (`mp.spawn`, `notebook_launcher`) but one."""
        if self.launch is not None and self.launch.processes is not None:
            return self.launch.one_process
        processes = self.settings.get("num_processes") if self.settings else None
        if processes is None or str(processes.value).strip() != "1":
            return False
        return not any(self.facts.callee_is(call, SPAWNS) for call in self.facts.calls)

    @cached_property
    def fp16(self) -> bool:
        """fp16 mixed precision: ``Accelerator(mixed_precision="fp16")`` (or a name bound to that literal), or the
        launch's ``mixed_precision``."""
        for call in self.accelerators:
            value = argument_of(call, "mixed_precision", None)
            if value is not None and string_literal(value, self.facts, call) == "fp16":
                return True
        setting = self.settings.get("mixed_precision") if self.settings else None
        return setting is not None and str(setting.value).strip().lower() == "fp16"

    # -- prepared models ----------------------------------------------------------------------

    def is_accelerate_prepare(self, call: cst.CSTNode) -> bool:
        """``accelerator.prepare(...)`` / ``accelerator.prepare_model(...)`` of an Accelerator (or of a name that says
        it is one: an accelerator handed in by code lintdist cannot see)."""
        if not isinstance(call, cst.Call) or not isinstance(call.func, cst.Attribute):
            return False
        return call.func.attr.value in PREPARE_MODEL_METHODS and self.facts.accelerator_like(call.func.value, call)

    def prepared_model(self, expr: cst.BaseExpression, at: cst.CSTNode, depth: int = 0) -> cst.Call | None:
        """The ``accelerator.prepare(...)`` call a model expression holds the result of, or None.

        In one function the last assignment before ``at`` decides (``model = Net()`` then ``model =
        accelerator.prepare(model)``); a parameter is prepared when every call site passes a prepared model; a module
        global or a ``self.`` attribute when one of its assignments prepares it.
        """
        if depth > MAX_DEPTH:
            return None
        facts = self.facts
        if isinstance(expr, cst.Call):
            if self.is_accelerate_prepare(expr):
                return expr
            method = facts.method_name(expr)
            if isinstance(expr.func, cst.Attribute) and method in SAME_MODEL_METHODS:
                return self.prepared_model(expr.func.value, expr, depth + 1)
            if method in UNWRAP_METHODS and expr.args:
                return self.prepared_model(expr.args[0].value, expr, depth + 1)
            if facts.callee_is(expr, WRAPPING_FUNCTIONS) and expr.args:
                return self.prepared_model(expr.args[0].value, expr, depth + 1)
            for function in facts.local_functions(expr):
                for returned in facts.returns.get(function, ()):
                    found = self.prepared_model(returned, returned, depth + 1)
                    if found is not None:
                        return found
            return None
        if isinstance(expr, cst.Subscript):
            return self._prepared_origin(expr, at, depth)  # `parts[0]` of `parts = accelerator.prepare(...)`
        if not isinstance(expr, (cst.Name, cst.Attribute)):
            return None
        key = get_full_name_for_node(expr)
        if key is None:
            return None
        if isinstance(expr, cst.Attribute) and expr.attr.value == "module" and not facts.bindings(key, at):
            return self.prepared_model(expr.value, at, depth + 1)  # `model.module.parameters()`
        if not key.startswith(("self.", "cls.")):
            binding = self.binding_before(expr, at)
            if isinstance(binding, cst.AugAssign):
                return None
            if binding is not None:
                statement, unpacked = binding
                value = statement.value
                if not unpacked:
                    return self.prepared_model(value, statement, depth + 1)
                if self.is_accelerate_prepare(value):
                    return value
                return self._prepared_origin(expr, at, depth)
            parameter = facts.parameter(expr.value, at) if isinstance(expr, cst.Name) else None
            if parameter is not None:
                function, index, _ = parameter
                found = []
                for site in facts.call_sites(function):
                    argument = facts.argument_for(site, function, expr.value, index)
                    prepared = self.prepared_model(argument, site, depth + 1) if argument is not None else None
                    if prepared is None:
                        return None
                    found.append(prepared)
                if found:
                    return found[0]
                # no caller in this file: the project's other modules may pass a prepared model
                return self._prepared_origin(expr, at, depth) if facts.external_call_sites(function) else None
            if isinstance(expr, cst.Name) and facts.enclosing_function(at) is None and not self._bound_later(expr, at):
                # module code runs in order: an assignment after `at` reaches it only through a loop around both (a
                # guide's plain loop, then its accelerate version, read as one program)
                return self._prepared_by_api(expr, at)
        return self._prepared_origin(expr, at, depth)

    def _bound_later(self, expr: cst.Name, at: cst.CSTNode) -> bool:
        """A module-level name that a loop around ``at`` binds again later: the next iteration sees that binding."""
        facts = self.facts
        loop = facts.enclosing_loop(at)
        while loop is not None:
            if any(facts.is_within(binding.statement, loop) for binding in facts.bindings(expr.value, at)):
                return True
            loop = facts.enclosing_loop(loop)
        return False

    def _prepared_origin(self, expr: cst.BaseExpression, at: cst.CSTNode, depth: int) -> cst.Call | None:
        for origin in self.facts.origins(expr, at):
            if self.is_accelerate_prepare(origin.node):
                return origin.node
            if isinstance(origin.node, cst.Call) and origin.node is not expr and origin.index is None:
                found = self.prepared_model(origin.node, origin.node, depth + 1)
                if found is not None:
                    return found
        return self._prepared_by_api(expr, at)

    def _prepared_by_api(self, expr: cst.BaseExpression, at: cst.CSTNode) -> cst.Call | None:
        """A model nothing in sight binds, handed to an Accelerator's ``accumulate(...)`` in the same scope (a
        snippet, or a notebook cell whose earlier cells prepared it): accelerate's accumulation needs the prepared
        model, so it is one; a stand-in ``accelerator.prepare(model)`` says so."""
        facts = self.facts
        key = get_full_name_for_node(expr) if isinstance(expr, (cst.Name, cst.Attribute)) else None
        if key is None or facts.index.order(expr) < 0 or not facts.unbound(expr, at):
            return None
        scope = facts.enclosing_function(at)
        for call in facts.calls:
            if (
                facts.method_name(call) == "accumulate"
                and isinstance(call.func, cst.Attribute)
                and facts.enclosing_function(call) is scope
                and any(get_full_name_for_node(arg.value) == key for arg in call.args)
                and facts.is_accelerator(call.func.value, call)
            ):
                receiver = get_full_name_for_node(call.func.value)
                note = f"`{key}` is handed to `{receiver}.accumulate()`"
                return facts.stand_in(f"{receiver}.prepare({key})", expr, note)
        return None

    def called_model(self, call: cst.Call) -> cst.Call | None:
        """The prepare call behind ``model(...)`` / ``model.forward(...)``, when ``model`` is a prepared model."""
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value == "forward":
            func = func.value
        if not isinstance(func, (cst.Name, cst.Attribute)):
            return None
        return self.prepared_model(func, call)

    def loss_model(self, loss: cst.BaseExpression, at: cst.CSTNode) -> cst.Call | None:
        """The prepare call of the model a loss is computed from: a call of a prepared model in the expression or in
        what its names were last assigned (``outputs = model(**batch)``, ``loss = criterion(outputs, y)``)."""
        return self._loss_model(loss, at, 0, {})

    def _loss_model(self, expr: cst.CSTNode, at: cst.CSTNode, depth: int, memo: dict) -> cst.Call | None:
        if depth > MAX_DEPTH or id(expr) in memo:
            return memo.get(id(expr))
        memo[id(expr)] = None
        facts = self.facts
        if facts.under_no_grad(at):
            return None  # no gradient flows out of what runs under `torch.no_grad()`, nor out of `x.detach()`
        attributes = {id(a.attr) for a in facts.within(expr, cst.Attribute)}
        calls = facts.within(expr, cst.Call)
        called = {id(c.func) for c in calls}
        cut = [c for c in calls if facts.method_name(c) in DETACHING and isinstance(c.func, cst.Attribute)]
        found = None
        for node in facts.within(expr, cst.Call, cst.Name):
            if any(node is c.func.value or facts.is_within(node, c.func.value) for c in cut):
                continue
            if isinstance(node, cst.Call):
                found = self.called_model(node)
                if found is None and facts.local_functions(node):
                    returns = [r for f in facts.local_functions(node) for r in facts.returns.get(f, ())]
                    found = next((m for r in returns if (m := self._loss_model(r, r, depth + 1, memo))), None)
            elif id(node) not in attributes and id(node) not in called and node.value not in {"self", "True", "False"}:
                binding = self.binding_before(node, at)
                if isinstance(binding, cst.AugAssign):
                    found = self._loss_model(binding.value, binding, depth + 1, memo)
                    if found is None:
                        found = self._loss_model(binding.target, binding, depth + 1, memo)
                elif binding is not None:
                    statement = binding[0]
                    found = self._loss_model(statement.value, statement, depth + 1, memo)
            if found is not None:
                break
        memo[id(expr)] = found
        return found

    def parameters_model(self, params: cst.BaseExpression, at: cst.CSTNode, depth: int = 0) -> cst.Call | None:
        """The prepare call of the model whose parameters ``params`` holds: ``model.parameters()``, a list or chain
        built from them, or a name assigned one of those."""
        if depth > MAX_DEPTH:
            return None
        facts = self.facts
        for node in facts.within(params, cst.Call, cst.Name):
            if isinstance(node, cst.Call):
                if isinstance(node.func, cst.Attribute) and facts.method_name(node) in PARAMETER_METHODS:
                    found = self.prepared_model(node.func.value, node)
                    if found is not None:
                        return found
            elif not isinstance(facts.parent(node), cst.Attribute):
                binding = self.binding_before(node, at)
                if isinstance(binding, tuple) and not binding[1]:
                    found = self.parameters_model(binding[0].value, binding[0], depth + 1)
                    if found is not None:
                        return found
        return None

    def accelerator_at(self, prepare: cst.Call, at: cst.CSTNode) -> str | None:
        """An expression naming the Accelerator that prepared the model, valid at ``at``: the receiver of the prepare
        call, ``accelerator`` or ``self.accelerator``, if that name holds an Accelerator there (a parameter, a module
        global, a local of the same function or an attribute of the same class)."""
        facts = self.facts
        receiver = get_full_name_for_node(prepare.func.value) if isinstance(prepare.func, cst.Attribute) else None
        candidates = [c for c in (receiver, "accelerator", "self.accelerator") if c]
        for text in dict.fromkeys(candidates):
            if text.startswith("self.") and (facts.enclosing_function(at) is None or not in_method(facts, at)):
                continue
            expr = cst.parse_expression(text)
            if facts.is_accelerator(expr, at):
                return text
            if text == receiver and self._visible(text, at, prepare):
                return text
        return None

    def _visible(self, text: str, at: cst.CSTNode, prepare: cst.Call) -> bool:
        """The prepare call's receiver, which lintdist could not trace to ``Accelerator(...)``, is still the same name
        at ``at``: a plain name used in the function that prepared the model, or a ``self.`` attribute read in a
        method of the same class."""
        facts = self.facts
        if text.startswith("self."):
            return facts.enclosing_class(prepare) is facts.enclosing_class(at) and in_method(facts, at)
        same = facts.enclosing_function(prepare) is facts.enclosing_function(at)
        return same and "." not in text

    # -- the loss -------------------------------------------------------------------------------

    @cached_property
    def token_evidence(self) -> bool:
        """A ``-100`` label, an ``ignore_index=``/``label_pad_token_id=`` expression or a token collator."""
        facts = self.facts
        for node in facts.index.nodes(cst.UnaryOperation):
            if (
                isinstance(node.operator, cst.Minus)
                and isinstance(node.expression, cst.Integer)
                and node.expression.value == "100"
                and not isinstance(facts.parent(node), (cst.Slice, cst.Index))
            ):
                return True
        for node in facts.index.nodes(cst.Arg):
            # A non-negative literal (`ignore_index=255`) is a segmentation void label, not token padding.
            if (
                node.keyword is not None
                and node.keyword.value in {"ignore_index", "ignore_idx", "label_pad_token_id"}
                and not isinstance(node.value, cst.Integer)
            ):
                return True
        for node in facts.index.nodes(cst.Assign):
            # targets masked with -1 by hand (`targets = torch.full(shape, -1)`, `row_targets[mask == 0] = -1`)
            if _masks_targets(facts, node):
                return True
        for node in facts.index.nodes(cst.Attribute):
            # the padding label read off a loss object (`self._loss_fn.ignore_index`, torchtune's recipes)
            if node.attr.value == "ignore_index" and "loss" in (get_full_name_for_node(node.value) or "").lower():
                return True
        for node in facts.calls:
            names = facts.qualified_names(node.func) | {get_full_name_for_node(node.func) or ""}
            if any(name.rsplit(".", 1)[-1] in TOKEN_COLLATORS for name in names):
                return True
        return False

    @cached_property
    def short_fixed_labels(self) -> bool:
        """The labels are short targets tokenised to one fixed length: ``labels = tokenizer(targets,
        padding="max_length", max_length=3)`` with a literal of at most 8, or a length taken as the longest of a
        few class names (``max(len(tokenizer(c)["input_ids"]) for c in classes)``). Every example then has
        (nearly) the same number of label tokens, and a per-micro-batch mean is the token mean."""
        facts = self.facts
        for assign in facts.index.nodes(cst.Assign):
            call = assign.value.value if isinstance(assign.value, cst.Subscript) else assign.value
            if not isinstance(call, cst.Call) or not any(
                "label" in name.value.lower() or "target" in name.value.lower()
                for target in assign.targets
                for name in facts.within(target.target, cst.Name)
            ):
                continue
            padding, length = keyword(call, "padding"), keyword(call, "max_length")
            if not (isinstance(padding, cst.SimpleString) and padding.evaluated_value == "max_length"):
                continue
            if isinstance(length, cst.Integer) and int(length.value) <= 8:
                return True
            if isinstance(length, cst.Name) and any(
                isinstance(other.value, cst.Call)
                and get_full_name_for_node(other.value.func) == "max"
                and any(_is_name(t.target, length.value) for t in other.targets)
                for other in facts.index.nodes(cst.Assign)
            ):
                return True  # the name may be bound in an enclosing function: any such binding in the file
        return False

    def chain(self, expr: cst.BaseExpression, at: cst.CSTNode) -> Chain:
        """Walk a loss back to its base (a model's ``.loss``, a criterion, a helper's return) and its factors."""
        chain = Chain()
        self._walk(expr, at, 1, chain, 0)
        return chain

    @cached_property
    def _augmented(self) -> dict[str, list[cst.AugAssign]]:
        result: dict[str, list[cst.AugAssign]] = {}
        for node in self.facts.index.nodes(cst.AugAssign):
            key = get_full_name_for_node(node.target)
            if key:
                result.setdefault(key, []).append(node)
        return result

    def _walk(self, expr: cst.BaseExpression, at: cst.CSTNode, sign: int, chain: Chain, depth: int) -> None:
        if depth > MAX_WALK:
            chain.set_base("other", expr, at)
            return
        if isinstance(expr, cst.BinaryOperation):
            if isinstance(expr.operator, cst.Multiply):
                self._walk(expr.left, at, sign, chain, depth + 1)
                self._walk(expr.right, at, sign, chain, depth + 1)
            elif isinstance(expr.operator, cst.Divide):
                self._walk(expr.left, at, sign, chain, depth + 1)
                self._walk(expr.right, at, -sign, chain, depth + 1)
            elif isinstance(expr.operator, cst.FloorDivide):
                # integer arithmetic is a factor (`grad_accum_steps = per_step // per_micro_batch`), never the loss
                (chain.num if sign > 0 else chain.den).append(Term(expr, at))
            elif isinstance(expr.operator, cst.Add) and sign > 0:
                # two token means added (two views of a batch, two heads) are still a per-micro-batch mean
                left, right = Chain(), Chain()
                self._walk(expr.left, at, 1, left, depth + 1)
                self._walk(expr.right, at, 1, right, depth + 1)
                if all(c.base == "mean" and not c.num and not c.den for c in (left, right)):
                    chain.set_base("mean", left.base_expr, left.base_at)
                    chain.assumed = left.assumed or right.assumed
                else:
                    chain.set_base("other", expr, at)
            else:
                chain.set_base("other", expr, at)
            return
        base = self._base_kind(expr, at)
        if base is not None:
            kind, count = base
            if kind == "assumed":
                kind, chain.assumed = "mean", True
            chain.set_base(kind if sign > 0 else "other", expr, at)
            if count is not None:
                chain.den.append(Term(count, at))
            return
        if isinstance(expr, (cst.Name, cst.Attribute)):
            binding = self.binding_before(expr, at)
            if binding is not None:
                inner = Chain()
                self._walk_binding(expr, binding, 1, inner, depth)
                if inner.base is not None:
                    chain.set_base(inner.base if sign > 0 else "other", inner.base_expr, inner.base_at)
                    chain.assumed = chain.assumed or inner.assumed
                    chain.num.extend(inner.num if sign > 0 else inner.den)
                    chain.den.extend(inner.den if sign > 0 else inner.num)
                    return
        # a factor (even one computed over several statements) is reported where the loss uses it
        if isinstance(expr, cst.Call) and self.facts.local_functions(expr):
            returns = [r for f in self.facts.local_functions(expr) for r in self.facts.returns.get(f, ())]
            if len(returns) == 1:
                self._walk(returns[0], returns[0], sign, chain, depth + 1)
            else:
                chain.set_base("other", expr, at)
            return
        (chain.num if sign > 0 else chain.den).append(Term(expr, at))

    def _walk_binding(
        self, expr: cst.BaseExpression, binding: cst.CSTNode | tuple, sign: int, chain: Chain, depth: int
    ) -> None:
        if isinstance(binding, cst.AugAssign):
            if isinstance(binding.operator, (cst.DivideAssign, cst.MultiplyAssign)):
                self._walk(expr, binding, sign, chain, depth + 1)
                inverse = isinstance(binding.operator, cst.DivideAssign)
                self._walk(binding.value, binding, -sign if inverse else sign, chain, depth + 1)
            # a running total (`num_tokens += n`, `loss += part`) is no loss base: the name stays a factor
            return
        value, unpacked = binding
        if unpacked:
            # `loss, parts = token_loss_helper(logits, labels)`: the first value is the loss
            first = value.targets[0].target if isinstance(value, cst.Assign) else None
            if (
                isinstance(first, (cst.Tuple, cst.List))
                and first.elements
                and get_full_name_for_node(first.elements[0].value) == get_full_name_for_node(expr)
                and self.imported_token_loss(value.value)
            ):
                chain.set_base("mean", value.value, value)
                chain.assumed = True
            else:
                chain.set_base("other", expr, value)
            return
        self._walk(value.value, value, sign, chain, depth + 1)

    def binding_before(self, expr: cst.BaseExpression, at: cst.CSTNode):
        """The last assignment to ``expr``'s name before ``at`` in the same function: an AugAssign node, or
        (Assign-like statement, unpacked?). None when there is none, or when that assignment sits in another branch
        of an ``if``/``try`` than ``at`` (``if a: loss /= k; loss.backward()`` / ``else: accelerator.backward(loss)``)
        and so never reaches it."""
        binding = self._last_binding(expr, at)
        node = binding if isinstance(binding, cst.AugAssign) else binding[0] if binding is not None else None
        if node is not None and self.facts.exclusive(node, at):
            return None
        return binding

    def _last_binding(self, expr: cst.BaseExpression, at: cst.CSTNode):
        facts = self.facts
        key = get_full_name_for_node(expr)
        if not key:
            return None
        order = facts.index.order
        limit = order(at)
        function = facts.enclosing_function(at)
        candidates: list[tuple[int, object]] = []
        for binding in facts.bindings(key, at):
            # `model = torch.compile(model)`: the right side reads the value bound before this statement
            if order(binding.statement) < limit and not facts.is_within(at, binding.statement):
                candidates.append((order(binding.statement), (binding.statement, binding.index is not None)))
        for node in self._augmented.get(key, ()):
            if facts.enclosing_function(node) is function and order(node) < limit:
                candidates.append((order(node), node))
        if not candidates:
            return None
        return max(candidates, key=lambda item: item[0])[1]

    def accumulation_division(self, loss: cst.BaseExpression, at: cst.CSTNode, acc: Accumulation) -> Division | None:
        """The division of ``loss`` by the accumulation steps, if the loss has one and no factor that undoes it
        (the token-loss recipe multiplies by the steps on purpose: ``loss * GA * world / tokens``)."""
        num: list[Term] = []
        den: list[Term] = []
        self._split_factors(loss, at, 1, num, den, 0)
        if any(isinstance(t.expr, cst.Call) and self.facts.method_name(t.expr) in WINDOW_METHODS for t in num):
            return None
        divisions = [t for t in den if self._is_steps(t, acc)]
        if not divisions or any(self._is_steps(t, acc) for t in num):
            return None
        term = divisions[0]
        return Division(term, self._exact_steps(term.expr))

    def _split_factors(self, expr: cst.BaseExpression, at: cst.CSTNode, sign: int, num: list, den: list, depth: int):
        """Split a loss into the factors it is multiplied (``num``) and divided (``den``) by, through the assignments
        of its names in the same function (``loss = loss / k``, ``loss /= k``). Unlike ``chain`` it needs no
        recognised base: a custom criterion's loss divided by the steps is divided all the same."""
        if depth > MAX_WALK:
            return
        if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, (cst.Multiply, cst.Divide)):
            self._split_factors(expr.left, at, sign, num, den, depth + 1)
            inverse = isinstance(expr.operator, cst.Divide)
            self._split_factors(expr.right, at, -sign if inverse else sign, num, den, depth + 1)
            return
        if isinstance(expr, (cst.Name, cst.Attribute)) and sign > 0:  # a divisor stays the name it is divided by
            binding = self.binding_before(expr, at)
            if isinstance(binding, cst.AugAssign) and isinstance(
                binding.operator, (cst.DivideAssign, cst.MultiplyAssign)
            ):
                self._split_factors(binding.target, binding, sign, num, den, depth + 1)
                inverse = isinstance(binding.operator, cst.DivideAssign)
                self._split_factors(binding.value, binding, -sign if inverse else sign, num, den, depth + 1)
                return
            if isinstance(binding, tuple) and not binding[1] and isinstance(binding[0], cst.Assign):
                self._split_factors(binding[0].value, binding[0], sign, num, den, depth + 1)
                return
        if isinstance(expr, cst.Call):
            returns = [r for f in self.facts.local_functions(expr) for r in self.facts.returns.get(f, ())]
            if len(returns) == 1:  # a helper of this file that returns the loss
                self._split_factors(returns[0], returns[0], sign, num, den, depth + 1)
                return
        (num if sign > 0 else den).append(Term(expr, at))

    def _is_steps(self, term: Term, acc: Accumulation) -> bool:
        """The factor is the accumulation steps: ``accelerator.gradient_accumulation_steps``, a name that says
        accumulation (``args.gradient_accumulation_steps``, ``accum_iter``), or the literal the Accelerator is built
        with."""
        if self._exact_steps(term.expr) or (acc.expr is not None and _same_name(term.expr, acc.expr)):
            return True
        literal = integer_literal(term.expr, self.facts, term.at)
        if literal is not None:
            return acc.value is not None and literal == acc.value and acc.value > 1
        if not self._says_accumulation(term.expr, term.at, 0):
            return False
        return self.factor(term).kind not in {"count", "world"}  # `tokens_per_accum_window` is a count

    def _says_accumulation(self, expr: cst.BaseExpression, at: cst.CSTNode, depth: int) -> bool:
        """A name read in ``expr`` (or in what a name of it was last assigned) says accumulation. Attribute names
        after a dot are not variables: ``outputs.loss`` does not read the variable ``loss``."""
        facts = self.facts
        attributes = {id(a.attr) for a in facts.within(expr, cst.Attribute)}
        for node in facts.within(expr, cst.Name, cst.Attribute):
            if id(node) in attributes:
                continue
            name = (get_full_name_for_node(node) or "").lower()
            if "accum" in name or "gradient_accumulation" in name:
                return True
            if depth == 0 and isinstance(node, cst.Name):
                binding = self.binding_before(node, at)
                if (
                    isinstance(binding, tuple)
                    and not binding[1]
                    and self._says_accumulation(binding[0].value, binding[0], depth + 1)
                ):
                    return True
        return False

    def _exact_steps(self, expr: cst.BaseExpression) -> bool:
        """``<accelerator>.gradient_accumulation_steps``."""
        return _is_attribute(expr, "gradient_accumulation_steps") and self.facts.accelerator_like(expr.value, expr)

    def _base_kind(self, expr: cst.BaseExpression, at: cst.CSTNode) -> tuple[str, cst.BaseExpression | None] | None:
        """What a loss expression is: ("mean" | "sum" | "tokens" | "window", count it is already divided by)."""
        facts = self.facts
        if is_loss_field(expr):
            call = self.model_call(expr)
            count = keyword(call, "num_items_in_batch") if call is not None else None
            return ("sum", count) if count is not None else ("mean", None)
        if not isinstance(expr, cst.Call):
            return None
        method = facts.method_name(expr)
        if method in WINDOW_METHODS and isinstance(expr.func, cst.Attribute):
            return "window", None
        if facts.callee_is(expr, CE_FUNCTIONS):
            return reduction(expr), None
        if self.imported_token_loss(expr):
            return "assumed", None
        if isinstance(expr.func, (cst.Name, cst.Attribute)) and method not in {"mean", "sum"}:
            for origin in facts.origins(expr.func, at):
                if isinstance(origin.node, cst.Call) and facts.callee_is(origin.node, CE_MODULES):
                    return reduction(origin.node), None
        if method in {"mean", "sum"} and isinstance(expr.func, cst.Attribute) and not expr.args:
            inner = Chain()
            self._walk(expr.func.value, at, 1, inner, MAX_WALK - 4)
            if inner.base == "tokens" and not inner.num and not inner.den:
                return method, None
        return None

    def imported_token_loss(self, expr: cst.BaseExpression) -> bool:
        """A call of a loss function lintdist cannot read (imported, not torch's), given the batch's token labels
        in a file with token evidence: ``compute_token_loss(logits, labels)``. It is taken for a token mean, the
        default of every loss, unless it is told otherwise (``reduction=``, ``num_items_in_batch=``)."""
        facts = self.facts
        if not isinstance(expr, cst.Call) or not isinstance(expr.func, (cst.Name, cst.Attribute)):
            return False
        name = (get_full_name_for_node(expr.func) or "").rsplit(".", 1)[-1].lower()
        if facts.local_functions(expr) or not self.token_evidence:
            return False
        if any(
            arg.keyword is not None and arg.keyword.value in {"reduction", "num_items_in_batch"} for arg in expr.args
        ):
            return False
        if "model" in name and "loss" not in name:
            # `loss = model(inputs, targets)`: a model whose forward returns its own loss (nanoGPT-style
            # `forward(idx, targets)`, nanochat's `GPT`), given the micro-batch's masked targets
            code = facts.index.module.code_for_node
            return any(
                any(word in code(arg.value).lower() for word in ("label", "target"))
                for arg in expr.args
                if not arg.star
            )
        if "loss" not in name:
            return False
        qualified = facts.qualified_names(expr.func)
        if not qualified and isinstance(expr.func, cst.Attribute):
            # `self._loss_fn = config.instantiate(cfg.loss)`: a loss object built by an imported factory
            origins = facts.origins(expr.func, expr)
            if not origins or not all(
                isinstance(o.node, cst.Call) and o.index is None and not facts.local_functions(o.node) for o in origins
            ):
                return False
            qualified = frozenset(q for o in origins for q in facts.qualified_names(o.node.func))
        if not qualified or any(q.startswith(("torch.", "builtins.")) or "." not in q for q in qualified):
            return False  # torch's functions are read directly; a local name may hold anything
        if any(
            arg.keyword is not None and arg.keyword.value in {"reduction", "num_items_in_batch"} for arg in expr.args
        ):
            return False
        return any(
            "label" in (facts.index.module.code_for_node(arg.value)).lower() for arg in expr.args if not arg.star
        )

    def model_call(self, loss_field: cst.BaseExpression) -> cst.Call | None:
        """The call whose output ``.loss`` / ``["loss"]`` is read: inline, or the last assignment before the read."""
        value = loss_field.value
        if isinstance(value, cst.Call):
            return value
        binding = self.binding_before(value, loss_field) if isinstance(value, (cst.Name, cst.Attribute)) else None
        if isinstance(binding, tuple) and not binding[1] and isinstance(binding[0].value, cst.Call):
            return binding[0].value
        return None

    def loss_head(self, chain: Chain) -> str | None:
        """The loss's model head: "causal", "token" (other token-level heads), "sequence" (one target per example),
        "other" (another known head) or None (unknown)."""
        if chain.base_expr is None or not is_loss_field(chain.base_expr):
            return None
        call = self.model_call(chain.base_expr)
        return self.head(call.func, call) if call is not None else None

    def head(self, expr: cst.BaseExpression, at: cst.CSTNode, depth: int = 0) -> str | None:
        """The head of the model an expression holds (see ``loss_head``), through prepare, DDP and ``.to()``."""
        if depth > 4:
            return None
        # `model = model.to(...)` after `model = accelerator.prepare(model)` makes each binding an origin of the
        # others: without the memo the walk grows exponentially (accelerate's codeparrot example ran for minutes).
        key = id(expr)
        if key not in self._heads:
            self._heads[key] = None  # a cycle back to this expression adds nothing
            self._heads[key] = self._origin_head(expr, at, depth)
        return self._heads[key]

    def _origin_head(self, expr: cst.BaseExpression, at: cst.CSTNode, depth: int) -> str | None:
        facts = self.facts
        kinds = set()
        for origin in facts.origins(expr, at):
            node = origin.node
            if not isinstance(node, cst.Call):
                kinds.add(self.class_kind(node) if isinstance(node, (cst.Name, cst.Attribute)) else None)
                continue
            method = facts.method_name(node)
            if facts.is_prepare_call(node) or facts.callee_is(node, DDP_CLASSES):
                index = origin.index or 0
                keyword_name = "module" if facts.callee_is(node, DDP_CLASSES) else ""
                argument = argument_of(node, keyword_name, index)
                kinds.add(self.head(argument, node, depth + 1) if argument is not None else None)
            elif method in {"from_pretrained", "from_config", "_from_config"} and isinstance(node.func, cst.Attribute):
                kinds.add(self.class_kind(node.func.value))
            elif method in {"to", "cuda", "train", "float", "bfloat16", "half"} and isinstance(
                node.func, cst.Attribute
            ):
                kinds.add(self.head(node.func.value, node, depth + 1))
            else:
                kinds.add(self.class_kind(node.func))
        # `model = accelerator.prepare(model)` makes every binding an origin of every other: unknown paths drop out
        kinds.discard(None)
        return kinds.pop() if len(kinds) == 1 else None

    def class_kind(self, expr: cst.BaseExpression) -> str | None:
        """The head a class expression stands for, by its name or the bases of a class of this file."""
        return self._kind_of_names(self.facts.qualified_names(expr) | {get_full_name_for_node(expr) or ""}, 0)

    def _kind_of_names(self, names: set[str], depth: int) -> str | None:
        last = {name.rsplit(".", 1)[-1] for name in names if name}
        for part in sorted(last):
            kind = suffix_kind(part)
            if kind:
                return kind
        if depth < 3:
            for part in sorted(last):
                bases = self.facts.local_classes().get(part)
                kind = self._kind_of_names(bases, depth + 1) if bases else None
                if kind:
                    return kind
        return None

    def factor(self, term: Term) -> Factor:
        """What a factor of a loss is (memoised per expression)."""
        key = id(term.expr)
        memo = self._factors
        if key not in memo:
            memo[key] = self._classify(term.expr, term.at)
        return memo[key]

    def _classify(self, expr: cst.BaseExpression, at: cst.CSTNode) -> Factor:
        facts = self.facts
        value = integer_literal(expr, facts, at)
        total = isinstance(expr, cst.Name) and expr.value in self._running_totals()
        if value is not None and value > 0 and not total:  # `num_tokens = 0` then `num_tokens += n` is a count
            return Factor("accum", literal=value)
        nodes = self._closure(expr, at, 0)
        text = facts.index.module.code_for_node(expr).lower()
        names = {get_full_name_for_node(n) for n in nodes if isinstance(n, (cst.Name, cst.Attribute))} - {None}
        methods = {facts.method_name(n) for n in nodes if isinstance(n, cst.Call)}
        counted = (
            methods & {"ne", "count_nonzero", "count_loss_tokens", "global_token_count"}
            or any(isinstance(n, cst.ComparisonTarget) and isinstance(n.operator, cst.NotEqual) for n in nodes)
            or any(hint in text for hint in COUNT_NAME_HINTS)
        )
        if counted:
            in_place = any(
                facts.method_name(call) == "all_reduce"
                and call.args
                and get_full_name_for_node(call.args[0].value) in names | {get_full_name_for_node(expr)}
                for call in facts.calls
            )
            shifted = any(
                (
                    isinstance(n, cst.SubscriptElement)
                    and isinstance(n.slice, cst.Slice)
                    and isinstance(n.slice.lower, cst.Integer)
                    and n.slice.lower.value == "1"
                )
                or (isinstance(n, cst.Name) and n.value in {"shift_labels", "shifted_labels"})
                or (isinstance(n, cst.Arg) and _is_name(n.keyword, "shifted") and _is_name(n.value, "True"))
                for n in nodes
            )
            return Factor("count", gathered=bool(methods & GATHER_METHODS) or in_place, shifted=shifted)
        own = (get_full_name_for_node(expr) or "").lower() if isinstance(expr, (cst.Name, cst.Attribute)) else ""
        if "accum" in own:
            # named for accumulation, whatever it is computed from (nanochat: `grad_accum_steps = target_examples_per_step
            # // (device_batch_size * ddp_world_size)`)
            return Factor("accum")
        # `dist.get_world_size()`, Megatron's `get_data_parallel_world_size()`, `args.dp_world_size`,
        # `accelerator.num_processes`, `int(os.environ["WORLD_SIZE"])`
        if (
            any(method and method.endswith("world_size") for method in methods)
            or any(name.rsplit(".", 1)[-1].endswith(("num_processes", "world_size")) for name in names)
            or any(isinstance(n, cst.SimpleString) and n.evaluated_value == "WORLD_SIZE" for n in nodes)
        ):
            return Factor("world")
        if any("accum" in name or "gradient_accumulation" in name for name in names):
            return Factor("accum")
        return Factor("other")

    def count_sites(self, term: Term) -> list[cst.BaseExpression] | None:
        """What a token count compares with the ignore index (``labels`` of ``labels.ne(-100)`` or
        ``labels != -100``), following the names it is computed from; None when it counts some other way
        (``count_nonzero``, a helper) or the comparison is chained."""
        sites: dict[int, cst.BaseExpression] = {}
        for node in self._closure(term.expr, term.at, 0):
            if isinstance(node, cst.Call):
                method = self.facts.method_name(node)
                if method in {"count_nonzero", "count_loss_tokens", "global_token_count"}:
                    return None
                if method == "ne" and isinstance(node.func, cst.Attribute):
                    sites[id(node.func.value)] = node.func.value
            elif isinstance(node, cst.ComparisonTarget) and isinstance(node.operator, cst.NotEqual):
                comparison = self.facts.parent(node)
                if not isinstance(comparison, cst.Comparison) or len(comparison.comparisons) != 1:
                    return None
                sites[id(comparison.left)] = comparison.left
        return list(sites.values())

    def _closure(self, expr: cst.BaseExpression, at: cst.CSTNode, depth: int) -> list[cst.CSTNode]:
        """The nodes of ``expr`` that ``_classify`` reads, of what its names can hold, and so on (bounded)."""
        facts = self.facts
        nodes = list(facts.within(expr, *_CLOSURE_NODES))
        if depth >= 3:
            return nodes
        # the `loss` of `outputs.loss` is an attribute, not the variable `loss`: it is not followed
        attributes = {id(n.attr) for n in nodes if isinstance(n, cst.Attribute)}
        for name in [n for n in nodes if isinstance(n, (cst.Name, cst.Attribute)) and id(n) not in attributes]:
            for origin in facts.origins(name, at):
                if origin.node is not name:
                    nodes.extend(self._closure(origin.node, origin.node, depth + 1))
            if isinstance(name, cst.Name):
                # a running total: `tokens += (labels != -100).sum()`
                for total in self._running_totals().get(name.value, ()):
                    if facts.enclosing_function(total) is facts.enclosing_function(at):
                        nodes.extend(self._closure(total.value, total, depth + 1))
        return nodes

    def _running_totals(self) -> dict[str, list[cst.AugAssign]]:
        """``name += value`` statements of the file, by name."""
        if self._totals is None:
            self._totals = {}
            for node in self.facts.index.nodes(cst.AugAssign):
                if isinstance(node.operator, cst.AddAssign) and isinstance(node.target, cst.Name):
                    self._totals.setdefault(node.target.value, []).append(node)
        return self._totals


# The nodes of a loss factor that ``_classify`` reads (a ``ComparisonTarget`` for its ``!=`` operator).
_CLOSURE_NODES = (
    cst.Name,
    cst.Attribute,
    cst.Call,
    cst.SubscriptElement,
    cst.Arg,
    cst.SimpleString,
    cst.ComparisonTarget,
)


# -- small pure helpers ---------------------------------------------------------------------------


def _innermost(facts: PythonFacts, node: cst.CSTNode, blocks: dict[int, object]):
    for ancestor in facts.ancestors(node):
        if isinstance(ancestor, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            return None
        found = blocks.get(id(ancestor))
        if found is not None and facts.is_within(node, ancestor.body):
            return found
    return None


def is_accumulation_name(expr: cst.CSTNode) -> bool:
    """A name of accumulation steps (by its last part): ``args.gradient_accumulation_steps``, ``accum_iter``,
    ``grad_acc``, ``ga``."""
    name = (get_full_name_for_node(expr) or "").rsplit(".", 1)[-1].lower()
    return "accum" in name or name.startswith(("grad_acc", "ga_", "n_acc")) or name in {"ga", "gas"}


def _mentions_accumulation(facts: PythonFacts, expr: cst.BaseExpression) -> bool:
    """An expression naming accumulation steps (``is_accumulation_name`` of it or of a name in it)."""
    return any(is_accumulation_name(node) for node in (expr, *facts.within(expr, cst.Name, cst.Attribute)))


def range_bound(facts: PythonFacts, loop: cst.For) -> cst.BaseExpression | None:
    """``n`` of ``for i in range(n):`` (the builtin ``range``, one argument)."""
    iterator = loop.iter
    if (
        isinstance(iterator, cst.Call)
        and isinstance(iterator.func, cst.Name)
        and iterator.func.value == "range"
        and "builtins.range" in facts.qualified_names(iterator.func)
        and len(iterator.args) == 1
        and iterator.args[0].keyword is None
        and not iterator.args[0].star
    ):
        return iterator.args[0].value
    return None


def _same_name(a: cst.BaseExpression, b: cst.BaseExpression) -> bool:
    """Two expressions spell the same (dotted) name."""
    return get_full_name_for_node(a) == get_full_name_for_node(b) and get_full_name_for_node(a) is not None


def _may_be(facts: PythonFacts, func: cst.BaseExpression, *names: str) -> bool:
    """A callee spelled ``x.<name>`` or ``<name>``, or a name an import binds (an alias): the only callees worth
    resolving when looking for these functions. Resolving every call of a file costs more than the rules."""
    if isinstance(func, cst.Attribute):
        return func.attr.value in names
    return isinstance(func, cst.Name) and (func.value in names or func.value in facts.imported_names)


def _first_positional(call: cst.Call) -> cst.BaseExpression | None:
    return next((arg.value for arg in call.args if arg.keyword is None and not arg.star), None)


def _is_method_call(expr: cst.CSTNode | None, method: str) -> bool:
    return isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value == method


def _is_name(expr: cst.CSTNode | None, value: str) -> bool:
    return isinstance(expr, cst.Name) and expr.value == value


def _is_attribute(expr: cst.CSTNode | None, attr: str) -> bool:
    return isinstance(expr, cst.Attribute) and expr.attr.value == attr


def is_string_subscript(expr: cst.CSTNode | None, *literals: str) -> bool:
    """``x["key"]``: a subscript with one element, an index that is one of these string literals."""
    return (
        isinstance(expr, cst.Subscript)
        and len(expr.slice) == 1
        and isinstance(expr.slice[0].slice, cst.Index)
        and isinstance(expr.slice[0].slice.value, cst.SimpleString)
        and expr.slice[0].slice.value.value in literals
    )


def is_loss_field(expr: cst.BaseExpression | None) -> bool:
    """``outputs.loss`` or ``outputs["loss"]``."""
    return _is_attribute(expr, "loss") or is_string_subscript(expr, "'loss'", '"loss"')


def keyword(call: cst.Call, name: str) -> cst.BaseExpression | None:
    return next((arg.value for arg in call.args if arg.keyword is not None and arg.keyword.value == name), None)


def reduction(call: cst.Call) -> str:
    """A criterion's reduction: "mean", "sum", "tokens" (``reduction="none"``) or "other"."""
    if argument_of(call, "size_average", None) is not None or argument_of(call, "reduce", None) is not None:
        return "other"
    value = argument_of(call, "reduction", None)
    if value is None:
        return "mean"
    if isinstance(value, cst.SimpleString):
        return {"mean": "mean", "sum": "sum", "none": "tokens"}.get(value.evaluated_value, "other")
    return "other"


def suffix_kind(name: str) -> str | None:
    """The head a transformers class name says: "causal", "token", "sequence", "other" or None."""
    if name.endswith(CAUSAL_SUFFIXES) and not name.endswith("WithLMHeadModel"):
        return "causal"
    if name.endswith(TOKEN_SUFFIXES) or name in SEQ2SEQ_GENERATION:
        return "token"
    if name.endswith(SEQUENCE_SUFFIXES) and not name.startswith("Blip"):  # BLIP's VQA head is a text decoder
        return "sequence"
    if "For" in name and name.rsplit("For", 1)[-1][:1].isupper():
        return "other"
    return None


def integer_literal(expr: cst.BaseExpression, facts: PythonFacts, at: cst.CSTNode) -> int | None:
    """The integer an expression is, directly or through a name bound to a literal."""
    if isinstance(expr, cst.Integer):
        return int(expr.evaluated_value)
    if isinstance(expr, cst.Name):
        origins = facts.origins(expr, at)
        values = {o.node.evaluated_value for o in origins if isinstance(o.node, cst.Integer)}
        if len(values) == 1 and all(isinstance(o.node, cst.Integer) for o in origins):
            return int(values.pop())
    return None


def string_literal(expr: cst.BaseExpression, facts: PythonFacts, at: cst.CSTNode) -> str | None:
    """The string an expression is, directly or through a name bound to one literal."""
    if isinstance(expr, cst.SimpleString):
        return expr.evaluated_value
    if isinstance(expr, cst.Name):
        values = {o.node.evaluated_value for o in facts.origins(expr, at) if isinstance(o.node, cst.SimpleString)}
        return values.pop() if len(values) == 1 else None
    return None


def in_method(facts: PythonFacts, at: cst.CSTNode) -> bool:
    """``at`` is in a method whose first parameter is ``self``."""
    function = facts.enclosing_function(at)
    if function is None or facts.enclosing_class(function) is None:
        return False
    params = function.params.params
    return bool(params) and params[0].name.value == "self"


def _masks_targets(facts, assign: cst.Assign) -> bool:
    """``<label or target name>[...] = -1`` or ``<label or target name> = torch.full(shape, -1)``."""
    names = [
        (get_full_name_for_node(t.target.value if isinstance(t.target, cst.Subscript) else t.target) or "").lower()
        for t in assign.targets
    ]
    if not any("target" in n or "label" in n for n in names):
        return False
    value = assign.value
    if isinstance(value, cst.Call) and (get_full_name_for_node(value.func) or "").endswith("full"):
        fill = keyword(value, "fill_value") or (value.args[1].value if len(value.args) > 1 else None)
        value = fill
    return (
        isinstance(value, cst.UnaryOperation)
        and isinstance(value.operator, cst.Minus)
        and isinstance(value.expression, cst.Integer)
        and value.expression.value in {"1", "100"}
    )
