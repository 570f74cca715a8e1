"""LD502 lr-not-scaled: a literal learning rate in a data-parallel script whose global batch grows with the processes."""

from __future__ import annotations

import re

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import ACCELERATOR_CLASSES, DATALOADER_CLASSES, SAMPLER_CLASSES, argument_of
from lintdist.model import Severity
from lintdist.rule import Invalid, Rule, Valid

OPTIMIZERS = frozenset(
    {"SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adadelta", "Adamax", "NAdam", "RAdam", "ASGD", "Adafactor"}
)
LINEAR_RULE = frozenset({"SGD", "ASGD"})  # the linear scaling heuristic is an SGD result (Goyal et al. 2017)
# Names that say the script scales (or deliberately fixes) its learning rate for the global batch.
SCALING_WORDS = re.compile(
    r"scale_lr|lr_scale|scaled_lr|scaling_rule|linear_scaling|sqrt_scaling|lr_scaling|scale_learning_rate"
    r"|base_lr|\bblr\b|global_batch|total_batch|effective_batch",
    re.IGNORECASE,
)
WORLD = re.compile(r"(?:num_processes|world_size|num_replicas|n_?gpus?|num_gpus|num_devices|nprocs?)$", re.IGNORECASE)
# Tensor, context, sequence or pipeline parallelism: ranks that share a batch.
PARALLEL_WORDS = ("ParallelismConfig", "parallelism_config", "SequenceParallel", "tp_size", "cp_size", "sp_size")
LR_NAME = re.compile(r"(?:^|_)(?:lr|learning_rate)(?:$|_)", re.IGNORECASE)


class LrNotScaled(Rule):
    """
    ## What it does
    Reports, as advice, an optimizer built with a learning rate that is a
    number written in the script (`lr=3e-4`, or a module constant) in a
    data-parallel script whose global batch grows with the number of
    processes (a loader passed to `accelerator.prepare` without
    `DataLoaderConfiguration(split_batches=True)`, or a `DistributedSampler`
    beside a `DistributedDataParallel`/FSDP model), when the script steps that
    optimizer. It stays silent when the learning rate comes from the command
    line or a config (it is tuned per run); in test code (a `tests` folder,
    `test_*.py`, `*_test.py`: tests do not train to convergence); when
    anything in the script multiplies a learning rate by the number of
    processes or a batch size, or names a scaling rule (`scale_lr`,
    `base_lr`, `global_batch`...); under tensor, context or sequence
    parallelism (those ranks share a batch); and for a launch that runs one
    process. Off by default.

    ## Why is this bad?
    It may not be. Each process loads its own batch, so the global batch is
    the per-device batch times `num_processes` (times the accumulation
    steps), and the number of optimizer steps per epoch shrinks by the same
    factor. A learning rate tuned on one process then takes `num_processes`
    times fewer, equally long steps. The linear scaling rule (scale the rate
    with the global batch, with a warmup; Goyal et al. 2017) is a heuristic
    that holds for SGD in a range of batch sizes; Adam-family optimizers are
    often scaled by the square root, or not at all. A rate tuned for the
    global batch, or a run that keeps the global batch fixed by lowering the
    per-device batch, needs no change.

    ## Example
    ```python
    accelerator = Accelerator()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    ```

    ## Use instead
    ```python
    accelerator = Accelerator()
    base_lr = 0.1  # tuned for one process
    optimizer = torch.optim.SGD(model.parameters(), lr=base_lr * accelerator.num_processes, momentum=0.9)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    ```

    ## Fix safety
    There is no fix: whether and how to scale is a tuning decision.

    ## References
    - Goyal et al., "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour" (2017)
    - accelerate docs, "Comparing performance across distributed setups" (learning rate and `num_processes`)
    """

    code = "LD502"
    name = "lr-not-scaled"
    severity = Severity.INFO
    default_enabled = False
    triggers = ("torch.optim", "from torch import optim")
    also_triggers = (("prepare", "DistributedSampler"),)

    VALID = (
        Valid(
            """\
import torch
from accelerate import Accelerator

accelerator = Accelerator()
optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    accelerator.backward(model(batch).mean())
    optimizer.step()
"""
        ),
        Valid(
            """\
import torch
from accelerate import Accelerator

accelerator = Accelerator()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * accelerator.num_processes)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    accelerator.backward(model(batch).mean())
    optimizer.step()
"""
        ),
        Valid(
            """\
import torch
from accelerate import Accelerator, DataLoaderConfiguration

accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=True))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    accelerator.backward(model(batch).mean())
    optimizer.step()
"""
        ),
        Valid(
            """\
import torch
from accelerate import Accelerator

accelerator = Accelerator()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
for batch in loader:
    accelerator.backward(model(batch).mean())
    optimizer.step()
"""
        ),
        Valid(
            """\
import torch
from accelerate import Accelerator

accelerator = Accelerator()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    accelerator.backward(model(batch).mean())
    optimizer.step()
""",
            filename="test_training.py",
        ),
    )

    INVALID = (
        Invalid(
            """\
import torch
from accelerate import Accelerator

accelerator = Accelerator()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    accelerator.backward(model(batch).mean())
    optimizer.step()
""",
            lines=(5,),
        ),
        Invalid(
            """\
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

LEARNING_RATE = 3e-4

model = DDP(model)
loader = DataLoader(dataset, batch_size=32, sampler=DistributedSampler(dataset))
optimizer = torch.optim.AdamW(model.parameters(), LEARNING_RATE)
for batch in loader:
    model(batch).mean().backward()
    optimizer.step()
""",
            lines=(9,),
        ),
    )

    def finish(self) -> None:
        if self.context.is_test_module or self.loop.surely_single or self._mentions_scaling():
            return
        if self._model_parallel():
            return  # tensor, context or sequence parallel ranks share a batch: the data-parallel size is not W
        facts = self.facts
        grows = None
        for call in facts.calls:
            optimizer = self._optimizer_name(call)
            if optimizer is None:
                continue
            lr = argument_of(call, "lr", 1)
            if lr is None:
                continue
            value = self._literal(lr, call)
            if value is None:
                continue
            if grows is None:
                grows = self._batch_grows_with_processes()
            if not grows:
                return
            if self._stepped(call):
                self._report(lr, value, optimizer, grows)

    def _stepped(self, constructor: cst.Call) -> bool:
        """The script trains with this optimizer: it calls ``step()`` on it, or on what ``prepare`` made of it."""
        facts = self.facts
        for call in facts.calls:
            if facts.method_name(call) != "step" or not isinstance(call.func, cst.Attribute) or call.args:
                continue
            for origin in facts.origins(call.func.value, call):
                node = origin.node
                if node is constructor:
                    return True
                if isinstance(node, cst.Call) and origin.index is not None and facts.is_prepare_call(node):
                    positional = [arg.value for arg in node.args if arg.keyword is None and not arg.star]
                    if origin.index < len(positional) and any(
                        o.node is constructor for o in facts.origins(positional[origin.index], node)
                    ):
                        return True
        return False

    def _optimizer_name(self, call: cst.Call) -> str | None:
        if not isinstance(call.func, (cst.Name, cst.Attribute)):
            return None
        for name in self.facts.qualified_names(call.func):
            parts = name.split(".")
            if parts[:2] == ["torch", "optim"] and parts[-1] in OPTIMIZERS:
                return parts[-1]
        return None

    def _literal(self, expr: cst.BaseExpression, at: cst.CSTNode) -> str | None:
        """The number an expression is, written in the script: a literal, or a name bound only to one."""
        if isinstance(expr, (cst.Float, cst.Integer)):
            return expr.value
        if isinstance(expr, cst.Name):
            origins = self.facts.origins(expr, at)
            if origins and all(isinstance(o.node, (cst.Float, cst.Integer)) for o in origins):
                values = {o.node.value for o in origins}
                return values.pop() if len(values) == 1 else None
        return None

    def _model_parallel(self) -> bool:
        if any(word in self.context.text for word in PARALLEL_WORDS):
            return True
        settings = self.context.settings
        return settings is not None and any(
            name.startswith(("parallelism_config", "tp_", "cp_", "sp_")) for name in settings.values
        )

    def _mentions_scaling(self) -> bool:
        """A name of a scaling rule, or a learning rate multiplied or divided by the number of processes or a
        batch size, anywhere in the script."""
        facts = self.facts
        if SCALING_WORDS.search(self.context.text):
            return True
        for operation in facts.index.nodes(cst.BinaryOperation):
            if not isinstance(operation.operator, (cst.Multiply, cst.Divide, cst.FloorDivide)):
                continue
            names = [get_full_name_for_node(n) or "" for n in facts.within(operation, cst.Name, cst.Attribute)]
            last = [n.rsplit(".", 1)[-1] for n in names]
            if any(LR_NAME.search(n) for n in last) and any(WORLD.search(n) or "batch" in n.lower() for n in last):
                return True
        return False

    def _batch_grows_with_processes(self) -> str | None:
        """How the global batch grows with the processes: "accelerate" (a loader goes through ``prepare`` without
        ``split_batches``) or "ddp" (a ``DistributedSampler`` beside a DDP/FSDP model); None otherwise."""
        facts = self.facts
        prepares = [c for c in facts.calls if facts.is_prepare_call(c) and facts.method_name(c) == "prepare"]
        for call in prepares:
            for arg in call.args:
                if arg.keyword is not None or arg.star:
                    continue
                named = "loader" in (get_full_name_for_node(arg.value) or "").rsplit(".", 1)[-1].lower()
                built = any(
                    isinstance(o.node, cst.Call) and facts.is_instance_of(o.node, DATALOADER_CLASSES, "DataLoader")
                    for o in facts.origins(arg.value, call)
                )
                if (named or built) and not self._splits_batches(call):
                    return "accelerate"
        if facts.wrapped_models() and any(
            facts.is_instance_of(c, SAMPLER_CLASSES, "DistributedSampler") for c in facts.calls
        ):
            return "ddp"
        return None

    def _splits_batches(self, prepare: cst.Call) -> bool:
        facts = self.facts
        if not isinstance(prepare.func, cst.Attribute):
            return False
        for origin in facts.origins(prepare.func.value, prepare):
            accelerator = origin.node
            if not isinstance(accelerator, cst.Call) or not facts.callee_is(accelerator, ACCELERATOR_CLASSES):
                continue
            if any(arg.star for arg in accelerator.args):
                return True
            config = argument_of(accelerator, "dataloader_config", None)
            if config is None:
                continue
            for inner in facts.origins(config, accelerator):
                node = inner.node
                if not isinstance(node, cst.Call):
                    return True
                split = argument_of(node, "split_batches", 0)
                if split is not None and not (isinstance(split, cst.Name) and split.value == "False"):
                    return True
        return False

    def _report(self, lr: cst.BaseExpression, value: str, optimizer: str, grows: str) -> None:
        how = "each process loads its own batch" if grows == "accelerate" else "each rank samples its own batch"
        rule = (
            "the linear scaling rule (Goyal et al. 2017) would multiply it by `num_processes`, with a warmup"
            if optimizer in LINEAR_RULE
            else f"for {optimizer}, a square-root scaling (`lr * num_processes ** 0.5`) is the usual heuristic, if any"
        )
        message = (
            f"the learning rate `{value}` is a constant, while {how}: the global batch is `num_processes` times the "
            f"per-device batch; if `{value}` was tuned on one process, {rule}; if it was tuned for this global batch, "
            "nothing is wrong (advice, not a bug)"
        )
        self.report(lr, message)
