"""LD313 reentrant-checkpoint-with-unused-search: reentrant activation checkpointing under DDP with
`find_unused_parameters=True`, whose first backward raises "Expected to mark a variable ready only once".

What the libraries do, read in their source:

* torch 2.13 ``utils/checkpoint.py::checkpoint``: with ``use_reentrant`` not given it warns and sets
  ``use_reentrant = True`` (no exception, despite the warning's "Starting in PyTorch 2.9 ... will raise");
  ``checkpoint_sequential`` passes its ``use_reentrant=None`` on. The reentrant forward runs the segment under
  ``torch.no_grad()``, so the segment's parameters are not in the graph of the output.
* torch 2.13 ``nn/parallel/distributed.py``, the class docstring: with ``use_reentrant=True`` DDP works "when
  there are no unused parameters ... (make sure you are not passing `find_unused_parameters=True` to DDP)";
  ``static_graph=True`` supports "Reentrant backwards" and "Activation checkpointing when model has unused
  parameters". The reducer (C++) raises "Expected to mark a variable ready only once" when a parameter it already
  marked unused at forward time gets its gradient during backward.
* transformers 5.24 ``modeling_utils.py::PreTrainedModel._activation_checkpointing_enable`` (behind
  ``gradient_checkpointing_enable``): ``gradient_checkpointing_kwargs=None`` becomes ``{"use_reentrant": False}``;
  any dict given is passed to torch's ``checkpoint`` as it is (so ``{}`` is reentrant). transformers 4.x defaulted
  to reentrant. ``Trainer`` passes ``args.gradient_checkpointing_kwargs`` to it.
* transformers 5.24 ``Trainer`` turns ``args.activation_checkpointing_kwargs`` (alias
  ``gradient_checkpointing_kwargs``) of ``{}`` into None before it calls ``activation_checkpointing_enable``.
* peft 0.21.2 ``utils/other.py::prepare_model_for_kbit_training``: ``gradient_checkpointing_kwargs=None`` becomes
  ``{}``, passed to ``gradient_checkpointing_enable``, so torch's reentrant default applies.
* accelerate 1.15 ``DistributedDataParallelKwargs`` hands ``find_unused_parameters`` and ``static_graph`` to DDP;
  transformers ``TrainingArguments`` has ``ddp_find_unused_parameters`` and ``ddp_static_graph``, read by
  ``Trainer._build_accelerator_args`` when the Trainer is built (so a field assigned after parsing counts).
* Lightning ``pytorch/strategies/ddp.py::DDPStrategy.register_strategies`` registers
  ``"ddp_find_unused_parameters_true"`` (and ``ddp_spawn_``/``ddp_fork_``/``ddp_notebook_`` variants) as
  ``DDPStrategy(find_unused_parameters=True)``; fabric registers the first name too.
"""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.bindings import attribute_assignments
from lintdist.control import runs_only_if
from lintdist.deepspeed_settings import may_run_deepspeed
from lintdist.edits import with_keyword_last
from lintdist.facts import argument_of
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Rule, Valid
from lintdist.trainer_ddp import default_unused_search
from lintdist.values import constant_truth, known_value

CHECKPOINTS = frozenset({"torch.utils.checkpoint.checkpoint", "torch.utils.checkpoint.checkpoint_sequential"})
# What passes `find_unused_parameters` (and `static_graph`) to DDP.
SEARCHERS = ("DistributedDataParallel", "DistributedDataParallelKwargs", "DDPStrategy")
KWARGS = ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs")  # transformers 5 added the second
ENABLES = frozenset({"gradient_checkpointing_enable", "activation_checkpointing_enable"})
FLAGS = ("gradient_checkpointing", "activation_checkpointing")
REENTRANT = {
    "enable": "reentrant in transformers 4",
    "arguments": "reentrant in transformers 4",
    "peft": "peft passes `{}` on, which torch reads as reentrant",
}
FALSE_DICT = '{"use_reentrant": False}'
# Lightning's registered strategy names that build `DDPStrategy(find_unused_parameters=True)` (and no static graph).
LIGHTNING_SEARCHERS = frozenset(
    f"ddp{start}_find_unused_parameters_true" for start in ("", "_spawn", "_fork", "_notebook")
)


class ReentrantCheckpointWithUnusedSearch(Rule):
    """
    ## What it does
    Reports reentrant activation checkpointing in a file that also turns on
    DDP's search for unused parameters (`find_unused_parameters=True` given to
    `DistributedDataParallel`, accelerate's `DistributedDataParallelKwargs` or
    Lightning's `DDPStrategy`, or Lightning's strategy name
    `"ddp_find_unused_parameters_true"` and its `_spawn`/`_fork`/`_notebook`
    kin; `ddp_find_unused_parameters=True` given to transformers'
    `TrainingArguments` or assigned to a field of parsed arguments,
    `args.ddp_find_unused_parameters = True`), without `static_graph=True`
    (`ddp_static_graph=True`), or that hands a PEFT model
    (`get_peft_model(...)`, `PeftModel.from_pretrained(...)`) to a transformers
    `Trainer` whose arguments leave `ddp_find_unused_parameters` unset: the
    Trainer then searches, as it does for any model that is no
    `PreTrainedModel`. The Trainer builds DDP only on a launch of several
    processes, so this case is reported only where the launch (or the
    script: a process group, a wrapper) says so, and not in notebooks or
    tests; it is a warning when the arguments are parsed from the command
    line (`HfArgumentParser(...).parse_args_into_dataclasses()`), which may
    still set the field. Reentrant checkpointing is
    `torch.utils.checkpoint.checkpoint(...)` or `checkpoint_sequential(...)`
    with `use_reentrant=True` or without `use_reentrant` (torch's default is
    still reentrant), and transformers or peft checkpointing whose kwargs ask
    for it (`{"use_reentrant": True}`, or a dict without the key): in
    `model.gradient_checkpointing_enable(...)`
    (`activation_checkpointing_enable`), in `TrainingArguments(...)` with
    `gradient_checkpointing=True` (`activation_checkpointing`), assigned to
    parsed arguments (`args.gradient_checkpointing_kwargs = {...}` under
    `if args.gradient_checkpointing:`, or with `args.gradient_checkpointing =
    True`), and in peft's
    `prepare_model_for_kbit_training(...)`, which passes `{}` on when given no
    kwargs (unless the Trainer's arguments turn checkpointing on: the Trainer
    then enables it again with its own kwargs). Without kwargs (and, through
    the `Trainer`, with `{}`)
    transformers 5 checkpoints non-reentrantly and 4 reentrantly, so those
    are reported only when the project pins transformers below 5. A value
    lintdist cannot read is left alone, and so are the `Trainer`'s
    `ddp_find_unused_parameters` and accelerate's DDP kwargs handler when
    DeepSpeed may run the script (the `deepspeed` launcher, accelerate's
    DeepSpeed config or plugin, a `deepspeed=` config in the code): DeepSpeed
    wraps no DDP.

    ## Why is this bad?
    The reentrant variant runs the checkpointed segment's forward without
    recording a graph, so when DDP searches the output's graph for unused
    parameters after the forward, it finds none of the segment's parameters
    and marks them all ready. The backward then recomputes the segment and
    their gradients arrive, and DDP's reducer raises `RuntimeError: Expected
    to mark a variable ready only once ... has been marked as ready twice` at
    the first backward. Each of the two settings alone works. Fine-tuning
    adapters hits it without asking for the search: the Trainer turns it
    off for a checkpointing `PreTrainedModel`, but not for the PEFT model
    that wraps one.

    ## Example
    ```python
    model = DistributedDataParallel(model, device_ids=[local_rank], find_unused_parameters=True)
    model.module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    ```

    ## Use instead
    ```python
    model = DistributedDataParallel(model, device_ids=[local_rank], find_unused_parameters=True)
    model.module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ```

    ## Fix safety
    Unsafe: the fix sets `use_reentrant=False` (on the `checkpoint` call, or
    in `gradient_checkpointing_kwargs`). The non-reentrant variant computes the
    same gradients in the usual cases, but not in all: where no input of a
    segment requires grad, the reentrant variant leaves the segment's
    parameters without gradients (a frozen embedding before LoRA layers), and
    the non-reentrant one trains them; hooks and `torch.autograd.grad` inside
    the segment behave differently too. Dropping `find_unused_parameters=True`
    instead can expose parameters that really are unused. No fix is offered
    where the project's pinned range allows a transformers before 4.35 or a
    peft before 0.6, which do not take `gradient_checkpointing_kwargs`.

    ## References
    - torch 2.13 `utils/checkpoint.py::checkpoint` (`use_reentrant=None` warns, then is True) and
      `checkpoint_sequential`
    - torch 2.13 `nn/parallel/distributed.py::DistributedDataParallel` (docstring notes on checkpointing and
      `static_graph`); the reducer's "Expected to mark a variable ready only once" (`libtorch`)
    - transformers 5.24 `modeling_utils.py::PreTrainedModel._activation_checkpointing_enable`,
      `trainer.py::Trainer.__init__` (the kwargs it passes); peft 0.21.2
      `utils/other.py::prepare_model_for_kbit_training` (`{}` by default)
    - https://github.com/huggingface/accelerate/issues/2017: "Expected to mark a variable ready only once"
      with gradient checkpointing and `find_unused_parameters=True`; solved by not combining them
    - https://github.com/huggingface/transformers/pull/4659: DDP with `find_unused_parameters=True` and BERT
      checkpointing raises the error; with `find_unused_parameters=False` it runs
    - https://github.com/huggingface/accelerate/issues/389: users confirm
      `gradient_checkpointing_kwargs={"use_reentrant": False}` fixes it
    - transformers 5.24 `trainer.py::Trainer._build_accelerator_args` (4.x `Trainer._wrap_model`): with
      `ddp_find_unused_parameters` None, `find_unused_parameters` is `not is_activation_checkpointing` for a
      `PreTrainedModel` and True for any other model; peft `peft_model.py::PeftModel` derives from
      `PushToHubMixin, torch.nn.Module` only
    - https://github.com/mymusise/ChatGLM-Tuning/issues/152: `finetune.py` (checkpointing under the pinned
      transformers 4.27.1, `get_peft_model`, a Trainer with parsed arguments) raises 'lora_B.default.weight has
      been marked as ready twice' when launched with torchrun
    - https://github.com/huggingface/peft/issues/313: the same error under `accelerate launch` with
      `gradient_checkpointing_enable()`
    - Proof: tests/proofs/test_ld313_reentrant_unused.py (gloo, 2 ranks): a model with a reentrant checkpointed
      block under DDP with `find_unused_parameters=True` raises the error at the first backward on both ranks;
      after the fix it trains and the ranks stay equal
    """

    code = "LD313"
    name = "reentrant-checkpoint-with-unused-search"
    severity = Severity.ERROR
    fix_kind = "unsafe"
    triggers = ("find_unused_parameters", "get_peft_model", "PeftModel.from_pretrained")
    also_triggers = (("checkpoint", "prepare_model_for_kbit_training"),)
    needs_several_processes = True

    VALID = (
        Valid(
            """\
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint

model = DistributedDataParallel(net, find_unused_parameters=True)
hidden = checkpoint(block, x, use_reentrant=False)
"""
        ),
        Valid(
            """\
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint

model = DistributedDataParallel(net, find_unused_parameters=True, static_graph=True)
hidden = checkpoint(block, x, use_reentrant=True)
"""
        ),
        Valid(
            """\
from transformers import TrainingArguments

args = TrainingArguments("out", gradient_checkpointing=True, ddp_find_unused_parameters=True)
"""
        ),
        Valid(
            """\
from peft import prepare_model_for_kbit_training
from transformers import TrainingArguments

model = prepare_model_for_kbit_training(model, gradient_checkpointing_kwargs={"use_reentrant": False})
args = TrainingArguments("out", ddp_find_unused_parameters=True)
"""
        ),
        Valid(
            """\
from accelerate import DistributedDataParallelKwargs
from transformers import HfArgumentParser, TrainingArguments

(training_args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
handlers = [DistributedDataParallelKwargs(find_unused_parameters=True)]
if training_args.gradient_checkpointing:
    training_args.gradient_checkpointing_kwargs = {"use_reentrant": False}
"""
        ),
        Valid(
            """\
from transformers import HfArgumentParser, TrainingArguments

(training_args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
training_args.ddp_find_unused_parameters = True
training_args.ddp_static_graph = True
if training_args.gradient_checkpointing:
    training_args.gradient_checkpointing_kwargs = {"use_reentrant": True}
"""
        ),
        Valid(
            """\
from peft import get_peft_model, prepare_model_for_kbit_training
from transformers import Trainer, TrainingArguments

model = get_peft_model(prepare_model_for_kbit_training(base), config)
Trainer(model=model, args=TrainingArguments("out", ddp_find_unused_parameters=False)).train()
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
import torch.utils.checkpoint
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(torch.nn.Module):
    def forward(self, x):
        return self.head(torch.utils.checkpoint.checkpoint(self.body, x))


model = DDP(Net(), find_unused_parameters=True)
""",
            lines=(7,),
            unsafe_fixed="""\
import torch.utils.checkpoint
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(torch.nn.Module):
    def forward(self, x):
        return self.head(torch.utils.checkpoint.checkpoint(self.body, x, use_reentrant=False))


model = DDP(Net(), find_unused_parameters=True)
""",
        ),
        Invalid(
            """\
from accelerate import Accelerator, DistributedDataParallelKwargs

accelerator = Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
""",
            lines=(4,),
            unsafe_fixed="""\
from accelerate import Accelerator, DistributedDataParallelKwargs

accelerator = Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
""",
        ),
        Invalid(
            """\
from transformers import TrainingArguments

args = TrainingArguments(
    "out",
    gradient_checkpointing=True,
    gradient_checkpointing_kwargs={"use_reentrant": True},
    ddp_find_unused_parameters=True,
)
""",
            lines=(6,),
            unsafe_fixed="""\
from transformers import TrainingArguments

args = TrainingArguments(
    "out",
    gradient_checkpointing=True,
    gradient_checkpointing_kwargs={"use_reentrant": False},
    ddp_find_unused_parameters=True,
)
""",
        ),
        Invalid(
            """\
from peft import prepare_model_for_kbit_training
from torch.nn.parallel import DistributedDataParallel

model = prepare_model_for_kbit_training(model)
model = DistributedDataParallel(model, find_unused_parameters=True)
""",
            lines=(4,),
            unsafe_fixed="""\
from peft import prepare_model_for_kbit_training
from torch.nn.parallel import DistributedDataParallel

model = prepare_model_for_kbit_training(model, gradient_checkpointing_kwargs={"use_reentrant": False})
model = DistributedDataParallel(model, find_unused_parameters=True)
""",
        ),
        Invalid(
            """\
from transformers import HfArgumentParser, TrainingArguments

(training_args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
if training_args.gradient_checkpointing:
    training_args.gradient_checkpointing_kwargs = {"use_reentrant": True}
    training_args.ddp_find_unused_parameters = True
""",
            lines=(5,),
            unsafe_fixed="""\
from transformers import HfArgumentParser, TrainingArguments

(training_args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
if training_args.gradient_checkpointing:
    training_args.gradient_checkpointing_kwargs = {"use_reentrant": False}
    training_args.ddp_find_unused_parameters = True
""",
        ),
        Invalid(
            """\
import lightning as L
import torch.utils.checkpoint


class Net(L.LightningModule):
    def forward(self, x):
        return self.head(torch.utils.checkpoint.checkpoint(self.body, x))


trainer = L.Trainer(accelerator="gpu", devices=2, strategy="ddp_find_unused_parameters_true")
""",
            lines=(7,),
            unsafe_fixed="""\
import lightning as L
import torch.utils.checkpoint


class Net(L.LightningModule):
    def forward(self, x):
        return self.head(torch.utils.checkpoint.checkpoint(self.body, x, use_reentrant=False))


trainer = L.Trainer(accelerator="gpu", devices=2, strategy="ddp_find_unused_parameters_true")
""",
        ),
    )

    def check_python(self) -> None:
        search, default = self._unused_search()
        if search is None:
            return
        line = self.context.span(search).line
        where = f"under DDP with `find_unused_parameters=True` (line {line})"
        if default is not None:  # the Trainer's own choice for a PEFT model, see lintdist/trainer_ddp.py
            where = (
                f"under the DDP wrapper the Trainer (line {line}) builds on this launch of several processes, which "
                "searches for unused parameters since its model is a PEFT model (no PreTrainedModel) and "
                "`ddp_find_unused_parameters` is not set"
                + (" (unless the command line passes `--ddp_find_unused_parameters False`)" if default != "code" else "")
            )
        found_all = [self._reentrant(call) for call in self.facts.calls]
        found_all += [self._assigned_kwargs(assign) for assign in attribute_assignments(self.facts, KWARGS)]
        for found in found_all:
            if found is None:
                continue
            node, what, replacements = found
            self.report(
                node,
                f"{what} {where}: the reentrant forward records no graph, so DDP marks the segment's parameters "
                "unused after the forward, and the first backward raises RuntimeError 'Expected to mark a variable "
                "ready only once'; use `use_reentrant=False`"
                + (", or `ddp_find_unused_parameters=False` when every trainable parameter is used" if default else ""),
                severity=Severity.WARNING if default == "command line" else None,
                fix=Fix(Applicability.UNSAFE, "Checkpoint non-reentrantly (`use_reentrant=False`)", replacements)
                if replacements
                else None,
            )

    def _unused_search(self) -> tuple[cst.CSTNode | None, str | None]:
        """What turns on DDP's search for unused parameters, and None or, when it is the Trainer's default for a
        PEFT model, where the arguments come from ("code", "command line"): a keyword with a literal True in a call
        without ``static_graph=True``, ``args.ddp_find_unused_parameters = True`` (transformers'
        ``TrainingArguments``) with no ``args.ddp_static_graph = True``, a Lightning strategy name that means it, or
        a ``Trainer(...)`` whose default is to search; (None, None) when there is none."""
        facts = self.facts
        on_deepspeed = may_run_deepspeed(facts, self.settings, self.launch)
        static = [a for a in attribute_assignments(self.facts, ("ddp_static_graph",)) if self._truth(a.value) is True]
        for assign in attribute_assignments(self.facts, ("ddp_find_unused_parameters",)):
            if self._truth(assign.value) is True and not static and not on_deepspeed:
                return assign, None
        for string in facts.index.nodes(cst.SimpleString):
            owner = facts.parent(string)  # `Trainer(strategy="ddp_find_unused_parameters_true")`, Fabric alike
            if (
                isinstance(owner, cst.Arg)
                and owner.keyword is not None
                and owner.keyword.value == "strategy"
                and string.evaluated_value in LIGHTNING_SEARCHERS
            ):
                return string, None
        for call in facts.calls:
            keywords = {arg.keyword.value: arg for arg in call.args if arg.keyword is not None}
            if "ddp_find_unused_parameters" in keywords:
                if on_deepspeed:
                    continue
                search, static = keywords["ddp_find_unused_parameters"], keywords.get("ddp_static_graph")
            elif "find_unused_parameters" in keywords and (
                searcher := {name.rsplit(".", 1)[-1] for name in facts.qualified_names(call.func)} & set(SEARCHERS)
            ):
                if on_deepspeed and "DistributedDataParallelKwargs" in searcher:
                    continue  # accelerate hands the handler to DDP only, and DeepSpeed wraps no DDP
                search, static = keywords["find_unused_parameters"], keywords.get("static_graph")
            else:
                continue
            if self._truth(search.value) is True and (static is None or self._truth(static.value) is False):
                return search, None
        # the Trainer builds DDP only on a launch of several processes: wanted in sight (a notebook or a test runs one)
        several = self.loop.surely_distributed and not (self.context.path.suffix == ".ipynb" or self.context.is_test_module)
        trainers = facts.calls if several and not on_deepspeed else ()
        return next(((call, d) for call in trainers if (d := default_unused_search(facts, call))), (None, None))

    def _truth(self, expr: cst.BaseExpression) -> bool | None:
        return constant_truth(known_value(self.facts, expr))

    def _reentrant(self, call: cst.Call) -> tuple[cst.CSTNode, str, tuple] | None:
        """(the node to report, what it is, the fix's replacements) for a call that checkpoints reentrantly."""
        facts = self.facts
        if any(arg.star == "**" for arg in call.args):
            return None
        if facts.callee_is(call, CHECKPOINTS):
            given = argument_of(call, "use_reentrant", None)
            name = facts.method_name(call) or "checkpoint"
            if given is None:
                fixed = with_keyword_last(call, "use_reentrant", cst.Name("False"))
                return call, f"`{name}` without `use_reentrant` (torch's default is still True)", ((call, fixed),)
            if self._truth(given) is True:
                return given, f"`{name}(..., use_reentrant=True)`", ((given, cst.Name("False")),)
            return None
        kind = self._checkpointing(call)
        if kind is None:
            return None
        keyword = next((k for k in KWARGS if argument_of(call, k, None) is not None), None)
        kwargs = argument_of(call, keyword, None) if keyword else None
        if kwargs is None and kind == "enable" and call.args and call.args[0].keyword is None:
            keyword, kwargs = KWARGS[0], call.args[0].value
        # With no kwargs (or `{}` through the Trainer) transformers 5 checkpoints non-reentrantly, 4 reentrantly;
        # peft's `prepare_model_for_kbit_training` passes `{}` on, which torch reads as reentrant.
        transformers_4 = self.versions.allows("transformers", ">=5") is False
        if kwargs is None:
            if kind != "peft" and not transformers_4:
                return None
            if kind == "peft" and self._trainer_checkpoints():
                return None  # the Trainer enables checkpointing again with its own kwargs, which decide
            # the keyword came with transformers 4.35 and peft 0.6: no fix where the pinned range allows older ones
            older = self.versions.allows(*(("peft", "<0.6") if kind == "peft" else ("transformers", "<4.35")))
            fixed = with_keyword_last(call, KWARGS[0], cst.parse_expression(FALSE_DICT))
            return call, f"`{facts.method_name(call) or 'TrainingArguments'}` without `{KWARGS[0]}` ({REENTRANT[kind]})", (
                () if older else ((call, fixed),)
            )
        return self._kwargs_dict(kwargs, keyword, kind)

    def _kwargs_dict(
        self, kwargs: cst.BaseExpression, keyword: str, kind: str
    ) -> tuple[cst.CSTNode, str, tuple] | None:
        """(the node to report, what it is, the fix's replacements) for checkpointing kwargs that ask for the
        reentrant variant; None when they do not or cannot be read."""
        facts = self.facts
        transformers_4 = self.versions.allows("transformers", ">=5") is False
        value = known_value(facts, kwargs)
        if not isinstance(value, cst.Dict) or any(not isinstance(e, cst.DictElement) for e in value.elements):
            return None  # unreadable, or `{**other}` may carry the key
        entry = next(
            (e for e in value.elements if isinstance(e.key, cst.SimpleString) and e.key.evaluated_value == "use_reentrant"),
            None,
        )
        if entry is None:
            if kind == "arguments" and not transformers_4:
                return None  # the Trainer turns `{}` into None: transformers 5's non-reentrant default
            replacements = ((value, cst.parse_expression(FALSE_DICT)),) if value is kwargs and not value.elements else ()
            return kwargs, f"`{keyword}` without `use_reentrant` (torch's default is still True)", replacements
        if self._truth(entry.value) is not True:
            return None
        replacements = ((entry.value, cst.Name("False")),) if value is kwargs else ()
        return entry, f'`{keyword}` with `"use_reentrant": True`', replacements

    def _checkpointing(self, call: cst.Call) -> str | None:
        """How a call turns on transformers' checkpointing: "enable" (``model.gradient_checkpointing_enable()``),
        "arguments" (``TrainingArguments(gradient_checkpointing=True)`` and its kin), "peft"
        (``prepare_model_for_kbit_training``, which checkpoints unless told not to); None for any other call."""
        facts = self.facts
        name = facts.method_name(call) or (call.func.value if isinstance(call.func, cst.Name) else None)
        if name in ENABLES:
            return "enable"
        if name == "prepare_model_for_kbit_training":
            use = argument_of(call, "use_gradient_checkpointing", 1)
            return "peft" if use is None or self._truth(use) is True else None
        flag = next((argument_of(call, f, None) for f in FLAGS if argument_of(call, f, None) is not None), None)
        return "arguments" if flag is not None and self._truth(flag) is True else None

    def _trainer_checkpoints(self) -> bool:
        """The Trainer's arguments turn checkpointing on (``TrainingArguments(gradient_checkpointing=True)`` or
        ``args.gradient_checkpointing = True``): it calls the model's enable method again when it is built."""
        return any(self._checkpointing(call) == "arguments" for call in self.facts.calls) or any(
            self._truth(a.value) is True for a in attribute_assignments(self.facts, FLAGS)
        )

    def _assigned_kwargs(self, assign: cst.Assign) -> tuple[cst.CSTNode, str, tuple] | None:
        """``args.gradient_checkpointing_kwargs = {...}`` read as the same keyword given to ``TrainingArguments``:
        a dict asking for ``use_reentrant=True`` (or, under transformers 4, one without the key), where
        checkpointing is on (under ``if args.gradient_checkpointing`` or with ``args.gradient_checkpointing = True``)
        and the field is written nowhere else in the file (a later write or key update may undo it)."""
        target = assign.targets[0].target
        owner = get_full_name_for_node(target.value)
        switched_on = {
            get_full_name_for_node(a.targets[0].target.value)
            for a in attribute_assignments(self.facts, FLAGS)
            if self._truth(a.value) is True
        }
        flags = {f"{owner}.{flag}" for flag in FLAGS}
        if owner is None or not (owner in switched_on or runs_only_if(self.facts, assign, flags)):
            return None
        field = f"{owner}.{target.attr.value}"
        writes = [  # `args.<kwargs> = ...` elsewhere, or `args.<kwargs>["use_reentrant"] = False`: not its last value
            t.target
            for a in self.facts.index.nodes(cst.Assign)
            for t in a.targets
            if a is not assign
            and get_full_name_for_node(t.target.value if isinstance(t.target, cst.Subscript) else t.target) == field
        ]
        if writes:
            return None
        return self._kwargs_dict(assign.value, target.attr.value, "arguments")
