"""LD502 lr-not-scaled: a literal learning rate in a data-parallel script whose global batch grows with the processes."""

from __future__ import annotations

import re

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import argument_of
from lintdist.global_batch import batch_grows_with_processes
from lintdist.model import Severity
from lintdist.optimizers import optimizer_class, stepped
from lintdist.parallelism import model_parallel
from lintdist.rule import Invalid, Rule, Valid
from lintdist.values import number_literal

LINEAR_RULE = frozenset({"SGD", "ASGD"})  # the linear scaling heuristic is an SGD result (Goyal et al. 2017)
# Names that say the script scales (or deliberately fixes) its learning rate for the global batch.
SCALING_WORDS = re.compile(
    r"scale_lr|lr_scale|scaled_lr|scaling_rule|linear_scaling|sqrt_scaling|lr_scaling|scale_learning_rate"
    r"|base_lr|\bblr\b|global_batch|total_batch|effective_batch",
    re.IGNORECASE,
)
WORLD = re.compile(r"(?:num_processes|world_size|num_replicas|n_?gpus?|num_gpus|num_devices|nprocs?)$", re.IGNORECASE)
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
        if model_parallel(self.context.text, self.context.settings):
            return  # tensor, context or sequence parallel ranks share a batch: the data-parallel size is not W
        facts = self.facts
        grows = None
        for call in facts.calls:
            optimizer = optimizer_class(facts, call)
            if optimizer is None:
                continue
            lr = argument_of(call, "lr", 1)
            if lr is None:
                continue
            value = number_literal(facts, lr, call)
            if value is None:
                continue
            if grows is None:
                grows = batch_grows_with_processes(facts)
            if not grows:
                return
            if stepped(facts, call):
                self._report(lr, value, optimizer, grows)

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
