"""LD501 stdlib-seed: `random.seed`/`np.random.seed`/`torch.manual_seed` in an accelerate script."""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import ACCELERATOR_CLASSES
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Rule, Valid
from lintdist.seeds import first_draws, per_rank_seed, seed_value, seeded_generator, worker_init

# accelerate 1.15 `accelerate/utils/random.py::set_seed` seeds these three, the accelerator's device and XLA.
ALL_THREE = frozenset({"random", "numpy", "torch"})
ACCELERATE_SET_SEED = frozenset({"accelerate.utils.set_seed", "accelerate.utils.random.set_seed"})
HOME = "accelerate.utils"


class StdlibSeed(Rule):
    """
    ## What it does
    Reports, in a script that imports accelerate, statements that seed the
    global generators one library at a time: `random.seed(n)`,
    `np.random.seed(n)`, `torch.manual_seed(n)`, `torch.cuda.manual_seed_all(n)`
    (a run of such statements in one block, with the same seed, is one
    finding, at its first statement). A run that seeds all three of `random`,
    `numpy` and `torch` is always reported; a run that seeds only some of them
    is reported only where the file draws from one it leaves unseeded
    (`np.random.permutation`, `random.shuffle`, `torch.randn`...), and not
    when it re-seeds (inside a loop, from the clock, after an earlier seed of
    the same generator) or seeds outside the run's setup (module level,
    `main`, `train...`, the function that makes the `Accelerator`): a test or
    a helper seeding one generator for its own purpose. Seeds of a local generator
    (`torch.Generator().manual_seed(n)`, `np.random.default_rng(n)`), a
    `torch.manual_seed(n)` whose returned generator is used, seeds inside a
    DataLoader `worker_init_fn`, and `random.seed()` without a seed are not
    reported.

    ## Why is this bad?
    It is seldom a bug, which is why the rule is off by default. A hand-written
    list of seeds is easy to get incomplete: `torch.manual_seed` alone leaves
    `random` and `numpy` unseeded (data augmentation and sampling code often
    draws from them), so runs are not reproducible, and no call of the three
    seeds the XLA generator on TPU. (`torch.manual_seed` does seed CUDA, MPS and
    XPU on all devices: `torch.cuda.manual_seed_all` next to it is redundant.)
    accelerate's `set_seed(n)` seeds `random`, `numpy`, `torch` (with the
    accelerator's device) and XLA in one call, and `set_seed(n,
    device_specific=True)` offsets the seed by the process index, for
    augmentation that must differ between ranks.

    ## Example
    ```python
    import random

    import numpy as np
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator()
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    ```

    ## Use instead
    ```python
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    accelerator = Accelerator()
    set_seed(args.seed)
    ```

    ## Fix safety
    Safe when the run seeds all three of `random`, `numpy` and `torch` with one
    value: `set_seed(n)` seeds the same generators with the same value (and XLA
    as well). A run seeded with `n + accelerator.process_index` becomes
    `set_seed(n, device_specific=True)`, which adds the same process index
    (`AcceleratorState().process_index`, the state the accelerator reads); any
    other per-rank seed (`n + local_rank`, `n + dist.get_rank()`, which
    accelerate's global process index need not equal) is kept as written,
    `set_seed(n + local_rank)`.
    Unsafe when the run seeds only some of them (`torch.manual_seed(0)` before
    building the model, to get the same initial weights on every rank, is
    right as it is): `set_seed` also seeds the others, whose streams change,
    and where they were seeded from the OS before, every rank now draws the same
    `random`/`numpy` numbers (identical augmentation on all ranks). No fix for
    a removed statement with a comment, or in a file that binds another
    `set_seed`.

    ## References
    - accelerate 1.15 `accelerate/utils/random.py::set_seed`; torch 2.13 `torch/random.py::manual_seed`
    - [huggingface/accelerate#236](https://github.com/huggingface/accelerate/issues/236): the same seed on
      every process gives the same augmentation; `device_specific` was added for it (PR #266)
    - [huggingface/accelerate#3387](https://github.com/huggingface/accelerate/pull/3387): an example's seeding
      only applied to CUDA, replaced by `accelerate.utils.set_seed`
    """

    code = "LD501"
    name = "stdlib-seed"
    severity = Severity.INFO
    default_enabled = False
    fix_kind = "safe"
    triggers = ("manual_seed", "random.seed")
    also_triggers = (("accelerate",),)

    VALID = (
        Valid("from accelerate.utils import set_seed\n\nset_seed(42)\n"),
        Valid(
            "import torch\nfrom accelerate import Accelerator\n\ngenerator = torch.Generator().manual_seed(0)\n"
            "image = pipe(prompt, generator=torch.manual_seed(0))\n"
        ),
        Valid(
            """\
import random

import numpy as np
from accelerate import Accelerator
from torch.utils.data import DataLoader


def seed_worker(worker_id):
    np.random.seed(1234 + worker_id)
    random.seed(1234 + worker_id)


loader = DataLoader(ds, num_workers=4, worker_init_fn=seed_worker)
"""
        ),
        Valid("import random\n\nimport torch\n\nrandom.seed(0)\ntorch.manual_seed(0)\n"),
        Valid(
            """\
import torch
from accelerate import Accelerator

torch.manual_seed(0)  # the same initial weights on every rank
model = torch.nn.Linear(4, 4)
accelerator = Accelerator()
for step in range(3):
    torch.manual_seed(step)
    noise = torch.randn(4)
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
import random

import numpy as np
import torch
from accelerate import Accelerator

accelerator = Accelerator()
random.seed(args.seed)
np.random.seed(args.seed)
torch.manual_seed(args.seed)
torch.cuda.manual_seed_all(args.seed)
model = build()
""",
            lines=(8,),
            fixed="""\
import random

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

accelerator = Accelerator()
set_seed(args.seed)
model = build()
""",
        ),
        Invalid(
            """\
import random

import numpy as np
import torch
from accelerate import Accelerator

accelerator = Accelerator()
seed = 7 + accelerator.process_index
torch.manual_seed(args.seed + accelerator.process_index)
np.random.seed(args.seed + accelerator.process_index)
random.seed(args.seed + accelerator.process_index)
""",
            lines=(9,),
            fixed="""\
import random

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

accelerator = Accelerator()
seed = 7 + accelerator.process_index
set_seed(args.seed, device_specific=True)
""",
        ),
        Invalid(
            """\
import numpy as np
import torch
from accelerate import Accelerator

torch.manual_seed(0)
model = build()
accelerator = Accelerator()
order = np.random.permutation(len(dataset))
""",
            lines=(5,),
            unsafe_fixed="""\
import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

set_seed(0)
model = build()
accelerator = Accelerator()
order = np.random.permutation(len(dataset))
""",
        ),
        Invalid(
            """\
import random

import numpy as np
import torch
from accelerate import Accelerator

random.seed(args.seed + local_rank)
np.random.seed(args.seed + local_rank)
torch.manual_seed(args.seed + local_rank)
""",
            lines=(7,),
            fixed="""\
import random

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

set_seed(args.seed + local_rank)
""",
        ),
    )

    def finish(self) -> None:
        facts = self.facts
        if not facts.imports("accelerate"):
            return
        seen: set[int] = set()
        for call in facts.calls:
            if id(call) in seen:
                continue
            statement = self._seed_statement(call)
            if statement is None:
                continue
            group = self._run(statement)
            seen.update(id(c) for _, c, _ in group)
            self._report(group)

    # -- what is a seed statement -------------------------------------------------------------------

    def _seed_statement(self, call: cst.Call) -> cst.SimpleStatementLine | None:
        """The line ``call`` makes up on its own, when it seeds a global generator with a value."""
        if seeded_generator(self.facts, call) is None:
            return None
        expr = self.facts.parent(call)
        line = self.facts.parent(expr) if isinstance(expr, cst.Expr) else None
        if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1 or worker_init(self.facts, call):
            return None
        return line

    def _run(self, first: cst.SimpleStatementLine) -> list[tuple[cst.SimpleStatementLine, cst.Call, str]]:
        """The consecutive seed statements from ``first`` on, in its block, with the same seed."""
        block = self.facts.parent(first)
        body = list(block.body) if isinstance(block, (cst.IndentedBlock, cst.Module)) else [first]
        start = next(i for i, s in enumerate(body) if s is first)
        group = []
        seed_text = None
        for line in body[start:]:
            expr = line.body[0] if isinstance(line, cst.SimpleStatementLine) else None
            call = expr.value if isinstance(expr, cst.Expr) else None
            if not isinstance(call, cst.Call) or self._seed_statement(call) is not line:
                break
            text = _code(self.context.module, seed_value(call))
            if seed_text is not None and text != seed_text:
                break
            seed_text = text
            group.append((line, call, seeded_generator(self.facts, call)))
        return group

    # -- the report and its fix -------------------------------------------------------------------

    def _report(self, group: list[tuple[cst.SimpleStatementLine, cst.Call, str]]) -> None:
        kinds = {kind for _, _, kind in group}
        first_call = group[0][1]
        seed = seed_value(first_call)
        missing = sorted(ALL_THREE - kinds)
        drawn: dict[str, int] = {}
        if missing:
            # a partial seeding is reported only where the file draws from a generator it leaves unseeded, and
            # not when it re-seeds one generator on purpose: in a loop, or from the clock
            if self.facts.enclosing_loop(group[0][0]) is not None or "time" in _code(self.context.module, seed):
                return
            if kinds == {"cuda"} and self._torch_seeded_nearby(group):
                return
            if not self._setup_scope(group[0][0]) or self._seeded_before(group):
                return
            drawn = {kind: self.context.span(call).line for kind, call in first_draws(self.facts, set(missing)).items()}
            if not drawn:
                return
        base = per_rank_seed(self.facts, seed, first_call)
        spelled = ", ".join(f"`{get_full_name_for_node(c.func)}`" for _, c, _ in group)
        if missing:
            left = ", ".join(f"`{m}` (drawn from at line {drawn[m]})" for m in missing if m in drawn)
            message = (
                f"{spelled} leaves {left} unseeded; accelerate's `set_seed(n)` seeds `random`, `numpy`, "
                f"`torch` and XLA together"
            )
        else:
            message = f"{spelled}: accelerate's `set_seed(n)` seeds the same generators (and XLA) in one call"
        fix, why = None, ""
        if (conflict := self._set_seed_conflict()) is not None:
            why = conflict
        elif any(_has_comment(line) for line, _, _ in group[1:]):
            why = "a comment on the replaced lines would be lost: no fix"
        else:
            specific = base is not None
            fix = self._fix(group, base if specific else seed, specific, unsafe=bool(missing))
        if base is not None:
            message += "; `set_seed(n, device_specific=True)` adds the same process index"
        if why:
            message += f" ({why})"
        self.report(first_call, message, fix=fix)

    def _setup_scope(self, line: cst.CSTNode) -> bool:
        """The seed is set where the run is set up: at module level, in `main`/`train...`, or in the function
        that makes the Accelerator (a test or a helper seeding one generator for its own purpose is not)."""
        function = self.facts.enclosing_function(line)
        if function is None or function.name.value == "main" or function.name.value.startswith("train"):
            return True
        return any(self.facts.callee_is(call, ACCELERATOR_CLASSES) for call in self.facts.calls_within(function))

    def _scope_seeds(self, line: cst.CSTNode) -> list[tuple[cst.Call, str]]:
        """The seed statements of ``line``'s function (or the module), with the generator each seeds."""
        scope = self.facts.enclosing_function(line)
        return [
            (call, seeded_generator(self.facts, call))
            for call in self.facts.calls
            if self.facts.enclosing_function(call) is scope and self._seed_statement(call) is not None
        ]

    def _seeded_before(self, group) -> bool:
        """An earlier seed statement of the same function seeds these generators: this one re-seeds on purpose
        (a per-rank seed after a shared one)."""
        order, first = self.facts.index.order, group[0][0]
        kinds = {kind for _, _, kind in group}
        return any(order(call) < order(first) and kind in kinds for call, kind in self._scope_seeds(first))

    def _torch_seeded_nearby(self, group) -> bool:
        """A lone `torch.cuda.manual_seed_all(n)` next to a `torch.manual_seed(n)` of the same scope (often under
        `if torch.cuda.is_available():`), which already seeds CUDA."""
        text = _code(self.context.module, seed_value(group[0][1]))
        return any(
            kind == "torch" and _code(self.context.module, seed_value(call)) == text
            for call, kind in self._scope_seeds(group[0][0])
        )

    def _set_seed_conflict(self) -> str | None:
        facts = self.facts
        if "set_seed" in facts.functions or facts._bindings.get("set_seed"):
            return "the file defines its own `set_seed`: no fix"
        for statement in facts.index.nodes(cst.ImportFrom):
            if isinstance(statement.names, cst.ImportStar):
                continue
            for alias in statement.names:
                bound = alias.asname.name if alias.asname is not None else alias.name
                if get_full_name_for_node(bound) == "set_seed" and not (
                    facts.qualified_names(bound) & ACCELERATE_SET_SEED
                    or get_full_name_for_node(statement.module) in ("accelerate", "accelerate.utils")
                ):
                    return "`set_seed` is imported from elsewhere here: no fix"
        return None

    def _fix(self, group, seed: cst.BaseExpression, device_specific: bool, *, unsafe: bool) -> Fix:
        extra = ", device_specific=True" if device_specific else ""
        new = cst.parse_expression(f"set_seed({self.context.module.code_for_node(seed)}{extra})")
        first_line = group[0][0]
        new_line = first_line.with_changes(body=[cst.Expr(new)])
        replacements = [(first_line, new_line)] + [(line, cst.RemovalSentinel.REMOVE) for line, _, _ in group[1:]]
        return Fix(
            Applicability.UNSAFE if unsafe else Applicability.SAFE,
            f"Seed with accelerate's `set_seed(n{extra})`",
            replacements=tuple(replacements),
            imports=((HOME, "set_seed"),),
        )


def _code(module: cst.Module, node: cst.CSTNode) -> str:
    return "".join(module.code_for_node(node).split())


def _has_comment(line: cst.SimpleStatementLine) -> bool:
    return line.trailing_whitespace.comment is not None or any(e.comment is not None for e in line.leading_lines)
