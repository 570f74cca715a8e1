"""LD701 data-parallel: `torch.nn.DataParallel` (single-process, multi-thread) instead of DDP."""

from __future__ import annotations

import re

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.branches import never_runs
from lintdist.model import Severity
from lintdist.rule import Invalid, Pattern, Rule, Valid

# The class under each name torch 2.13 exports it (torch/nn/__init__.py, torch/nn/parallel/__init__.py), and the
# functional form `torch.nn.parallel.data_parallel(module, inputs)` that builds the same replicas per call.
DATA_PARALLEL = frozenset(
    {
        "torch.nn.DataParallel",
        "torch.nn.parallel.DataParallel",
        "torch.nn.parallel.data_parallel.DataParallel",
    }
)
DATA_PARALLEL_FUNCTIONS = frozenset(
    {"torch.nn.parallel.data_parallel", "torch.nn.parallel.data_parallel.data_parallel"}
)


class DataParallelUsed(Rule):
    """
    ## What it does
    Reports a model wrapped in `torch.nn.DataParallel` (under any name:
    `nn.DataParallel`, `torch.nn.parallel.DataParallel`, an alias such as
    `from torch.nn import DataParallel as DP`, or a subclass of this file;
    a subclass that this file defines but does not build is reported at its
    base, since the project builds it elsewhere),
    and calls of the functional `torch.nn.parallel.data_parallel(module,
    inputs)`. A wrap behind `if torch.cuda.device_count() > 1:` is still
    reported: that is the case where `DataParallel` runs. A test such as
    `isinstance(model, nn.DataParallel)` (unwrapping a model) constructs
    nothing and is not reported, nor is a test module (`tests/`,
    `test_*.py`), which builds the wrapper to exercise code that handles it.

    ## Why is this bad?
    `DataParallel` is one process driving every GPU from Python threads: each
    step it replicates the module onto every device, scatters the batch from
    GPU 0, gathers the outputs back onto GPU 0 and computes the loss there.
    GPU 0 holds more memory than the others (the imbalance PyTorch's own
    warning talks about), the GIL serializes the threads, and it cannot span
    more than one machine. PyTorch's documentation of the class says: "It is
    recommended to use `DistributedDataParallel`, instead of this class, to do
    multi-GPU training, even if there is only a single node." One process per
    GPU with `DistributedDataParallel` (or `accelerate launch` with an
    `Accelerator`) overlaps the gradient all-reduce with the backward pass and
    is faster even on one node. The wrapper also prefixes every state-dict key
    with `module.`, and a `DataParallel` model's `forward` must not write to
    attributes (each replica writes its own copy, which is then discarded).

    ## Example
    ```python
    import torch

    model = Net().cuda()
    if torch.cuda.device_count() > 1:
        model = torch.nn.DataParallel(model)
    ```

    ## Use instead
    ```python
    # launched with `torchrun --nproc_per_node=N train.py` or `accelerate launch train.py`
    from accelerate import Accelerator

    accelerator = Accelerator()
    model, optimizer, loader = accelerator.prepare(Net(), optimizer, loader)
    ```

    ## Fix safety
    No fix: moving to one process per GPU changes how the script is launched,
    how the data is split (a `DistributedSampler` or `accelerator.prepare`),
    where the model is saved from and how metrics are reduced.

    ## References
    - `torch.nn.DataParallel` docstring (torch 2.13 `torch/nn/parallel/data_parallel.py`): "It is recommended to
      use `DistributedDataParallel`, instead of this class, to do multi-GPU training, even if there is only a
      single node." The class itself emits no deprecation warning, only the GPU-imbalance one.
    - PyTorch notes, "Use nn.parallel.DistributedDataParallel instead of multiprocessing or nn.DataParallel"
      (`cuda-nn-ddp-instead`).
    - princeton-vl/RAFT#33 (GPU 0 runs out of memory first under `DataParallel`, capping the batch size) and
      mapillary/inplace_abn#83 (an unbalanced run closed as "due to using `DataParallel` instead of
      `DistributedDataParallel`").
    - pytorch/tutorials#648, review by mrshenli: DDP "is expected to be faster than `DataParallel`, as
      `DistributedDataParallel` replicates models upfront instead of in every iteration and Global Interpreter
      Lock is no longer in the way".
    """

    code = "LD701"
    name = "data-parallel"
    severity = Severity.WARNING
    # `DataParallel` (not the end of `DistributedDataParallel`/`FullyShardedDataParallel`) called, imported under
    # an alias or subclassed; or the functional form
    triggers = (
        Pattern(
            ("DataParallel", "data_parallel"),
            re.compile(
                r"DataParallel(?<!DistributedDataParallel)(?<!ShardedDataParallel)(?:\s*\(|\s+as\s|\s*\):)"
                r"|parallel\.data_parallel\(|import data_parallel"
            ),
        ),
    )

    VALID = (
        Valid(
            """\
import torch.nn as nn

def unwrap(model):
    return model.module if isinstance(model, nn.DataParallel) else model
"""
        ),
        Valid(
            """\
import torch
from torch.nn.parallel import DistributedDataParallel

model = DistributedDataParallel(model, device_ids=[local_rank])
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
import torch

model = Net().cuda()
if torch.cuda.device_count() > 1:
    model = torch.nn.DataParallel(model)
""",
            lines=(5,),
        ),
        Invalid(
            """\
from torch.nn import DataParallel as DP

model = DP(Net(), device_ids=[0, 1])
""",
            lines=(3,),
        ),
        Invalid(
            """\
import torch.nn as nn

class Wrapped(nn.DataParallel):
    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)

model = Wrapped(net)
""",
            lines=(10,),
        ),
        Invalid(
            """\
from torch.nn.parallel import data_parallel

out = data_parallel(net, batch, device_ids=[0, 1])
""",
            lines=(3,),
        ),
    )

    def finish(self) -> None:
        if self.context.is_test_module:
            return
        facts = self.facts
        # subclasses of this file (`class Wrapped(nn.DataParallel)`), by name, so that only their calls and the
        # calls the resolver can cheaply rule in are resolved
        subclasses = {name for name, bases in facts.local_classes().items() if not bases.isdisjoint(DATA_PARALLEL)}
        built: set[str] = set()
        for call in facts.calls:
            if not _may_be_class(call):
                continue
            if never_runs(facts, call) is not None:
                continue  # `num_gpus = 1` ... `if num_gpus > 1: nn.DataParallel(...)`: a branch that never runs
            if facts.callee_is(call, DATA_PARALLEL_FUNCTIONS):
                self.report(call, _message("`torch.nn.parallel.data_parallel(...)`"))
            elif facts.callee_is(call, DATA_PARALLEL) or _last(call) in subclasses:
                built.add(_last(call))
                self.report(call, _message("`torch.nn.DataParallel`"))
        # a subclass the project builds elsewhere (`from utils import CustomDataParallel`): the class is the place
        for cls in facts.classes:
            if cls.name.value in subclasses - built and facts.enclosing_class(cls) is None:
                base = next(a for a in cls.bases if not self._bases(a).isdisjoint(DATA_PARALLEL))
                self.report(base, _message(f"`{cls.name.value}`, a subclass of `torch.nn.DataParallel`,"))

    def _bases(self, arg: cst.Arg) -> set[str]:
        return set(self.facts.qualified_names(arg.value)) | {get_full_name_for_node(arg.value) or ""}


def _may_be_class(call: cst.Call) -> bool:
    """A call that can construct a class: a name or an attribute (not a call's result or a subscript)."""
    return isinstance(call.func, (cst.Name, cst.Attribute))


def _last(call: cst.Call) -> str:
    func = call.func
    return func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""


def _message(what: str) -> str:
    return (
        f"{what} runs one process that drives every GPU from threads: it replicates the model each step, "
        "gathers outputs on GPU 0 (uneven memory, GIL-bound) and cannot span nodes; PyTorch recommends "
        "`DistributedDataParallel` even on one node: run one process per GPU with `torchrun` or "
        "`accelerate launch` (an `Accelerator` and `accelerator.prepare`)"
    )
