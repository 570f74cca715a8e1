"""LD605 optim-state-dict-to-load-discarded: `FSDP.optim_state_dict_to_load(...)` whose result is dropped."""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import argument_of
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Rule, Valid
from lintdist.value_uses import discarded

# torch 2.13 `FullyShardedDataParallel.optim_state_dict_to_load(model, optim, optim_state_dict,
# is_named_optimizer=False, load_directly=False, group=None)`, a staticmethod; the class is exported from
# `torch.distributed.fsdp` and defined in `torch.distributed.fsdp.fully_sharded_data_parallel`.
CONVERTERS = frozenset(
    {
        "torch.distributed.fsdp.FullyShardedDataParallel.optim_state_dict_to_load",
        "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel.optim_state_dict_to_load",
    }
)
OPTIM = ("optim", 1)
LOAD_DIRECTLY = ("load_directly", 4)


class OptimStateDictToLoadDiscarded(Rule):
    """
    ## What it does
    Reports a call of `FSDP.optim_state_dict_to_load(model, optim, osd)`
    (FSDP1's `FullyShardedDataParallel`, under any alias or import path)
    whose result is thrown away: a bare expression statement, or an
    assignment to a name (`_` included) that the function (or module) never
    reads. The report points at the call.

    ## Why is this bad?
    Despite its name, `optim_state_dict_to_load` only converts: it returns
    the flattened, sharded optimizer state dict for `optim` and leaves the
    optimizer untouched (torch `fully_sharded_data_parallel.py`: it calls
    `optim.load_state_dict(result)` only when `load_directly=True`, which is
    `False` by default). A resume that drops the result runs on with an
    empty optimizer: Adam's moments and step counts restart from zero while
    the model weights and the LR schedule resume, with no error or warning,
    and the loss spikes after every restart. Calls with `load_directly=True`
    (or a `load_directly` that is not a literal `False`) are not reported,
    nor are results that are used.

    ## Example
    ```python
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    osd = torch.load("optim.pt")
    FSDP.optim_state_dict_to_load(model, optimizer, osd)
    ```

    ## Use instead
    ```python
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    osd = torch.load("optim.pt")
    optimizer.load_state_dict(FSDP.optim_state_dict_to_load(model, optimizer, osd))
    ```

    ## Fix safety
    Safe: the call's value was unused, and the fix hands it to
    `optim.load_state_dict`, which is what the call's own `load_directly=True`
    does. The statement (the assignment, for an unused name) becomes
    `<optim>.load_state_dict(<call>)`, with `<optim>` the optimizer argument
    as written. There is no fix when that argument is not a plain name or
    attribute chain (evaluating it twice could differ), or is missing.

    ## References
    - torch `torch/distributed/fsdp/fully_sharded_data_parallel.py::optim_state_dict_to_load` (`load_directly`)
    - [PyTorch FSDP docs: optim_state_dict_to_load](https://pytorch.org/docs/stable/fsdp.html)
    """

    code = "LD605"
    name = "optim-state-dict-to-load-discarded"
    severity = Severity.ERROR
    fix_kind = "safe"
    triggers = ("optim_state_dict_to_load",)

    VALID = (
        Valid(
            """\
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

optimizer.load_state_dict(FSDP.optim_state_dict_to_load(model, optimizer, osd))
"""
        ),
        Valid(
            """\
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

FSDP.optim_state_dict_to_load(model, optimizer, osd, load_directly=True)
"""
        ),
        Valid(
            """\
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

def resume(model, optimizer, osd):
    flat = FSDP.optim_state_dict_to_load(model=model, optim=optimizer, optim_state_dict=osd)
    optimizer.load_state_dict(flat)
"""
        ),
        Valid("from mylib import FSDP\n\nFSDP.optim_state_dict_to_load(model, optimizer, osd)\n"),
    )
    INVALID = (
        Invalid(
            """\
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

FSDP.optim_state_dict_to_load(model, optimizer, osd)
""",
            lines=(3,),
            fixed="""\
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

optimizer.load_state_dict(FSDP.optim_state_dict_to_load(model, optimizer, osd))
""",
        ),
        Invalid(
            """\
import torch.distributed.fsdp as fsdp

class Trainer:
    def load(self, osd):
        state = fsdp.FullyShardedDataParallel.optim_state_dict_to_load(
            model=self.model, optim=self.optimizer, optim_state_dict=osd, load_directly=False
        )
""",
            lines=(5,),
            fixed="""\
import torch.distributed.fsdp as fsdp

class Trainer:
    def load(self, osd):
        self.optimizer.load_state_dict(fsdp.FullyShardedDataParallel.optim_state_dict_to_load(
            model=self.model, optim=self.optimizer, optim_state_dict=osd, load_directly=False
        ))
""",
        ),
        Invalid(
            """\
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

FSDP.optim_state_dict_to_load(model, make_optimizer(), osd)
""",
            lines=(3,),
        ),
        Invalid(
            "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n\n"
            "_ = FSDP.optim_state_dict_to_load(model, opt, osd)  # resume\n",
            lines=(3,),
            fixed=(
                "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n\n"
                "opt.load_state_dict(FSDP.optim_state_dict_to_load(model, opt, osd))  # resume\n"
            ),
        ),
    )

    def finish(self) -> None:
        facts = self.facts
        for call in facts.calls:
            if not facts.callee_is(call, CONVERTERS):
                continue
            load_directly = argument_of(call, *LOAD_DIRECTLY)
            if load_directly is not None and not (
                isinstance(load_directly, cst.Name) and load_directly.value == "False"
            ):
                continue  # True loads it; anything else is not known here
            statement = discarded(facts, call)
            if statement is None:
                continue
            optim = argument_of(call, *OPTIM)
            message = (
                "`optim_state_dict_to_load` only converts the optimizer state and returns it: the result is "
                "discarded, so the optimizer resumes with empty state (Adam moments and steps reset); pass it to "
                "`optim.load_state_dict(...)` (or give `load_directly=True`)"
            )
            self.report(call, message, fix=_fix(statement, call, optim))


def _fix(statement: cst.BaseSmallStatement, call: cst.Call, optim: cst.BaseExpression | None) -> Fix | None:
    if optim is None or get_full_name_for_node(optim) is None or not isinstance(optim, (cst.Name, cst.Attribute)):
        return None
    load = cst.Call(func=cst.Attribute(value=optim, attr=cst.Name("load_state_dict")), args=(cst.Arg(call),))
    new = cst.Expr(value=load, semicolon=statement.semicolon)
    return Fix(
        Applicability.SAFE, f"Load it: `{get_full_name_for_node(optim)}.load_state_dict(...)`", ((statement, new),)
    )
