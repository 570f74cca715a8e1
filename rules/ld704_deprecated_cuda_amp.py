"""LD704 deprecated-cuda-amp: `torch.cuda.amp`/`torch.cpu.amp` autocast, GradScaler and custom_fwd/bwd."""

from __future__ import annotations

import libcst as cst

from lintdist.amp import NEW_NAMES, SINCE, deprecated_amp, torch_amp_import
from lintdist.api_choice import chooses_api
from lintdist.edits import keyword_arg, with_arg_appended, with_arg_first
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Rule, Valid
from lintdist.spelling import binding_import, import_reads

DEPRECATED_SINCE = "2.4"
# `torch.cuda.amp.autocast(enabled=True, dtype=torch.float16, cache_enabled=True)` against
# `torch.amp.autocast(device_type, dtype=None, enabled=True, cache_enabled=None)`: positions differ.
AUTOCAST_POSITIONS = ("enabled", "dtype", "cache_enabled")


class DeprecatedCudaAmp(Rule):
    """
    ## What it does
    Reports calls of `torch.cuda.amp.autocast`, `torch.cuda.amp.GradScaler`,
    `torch.cpu.amp.autocast`, `torch.cpu.amp.GradScaler` and the decorators
    `torch.cuda.amp.custom_fwd`/`custom_bwd`, however they are imported
    (`from torch.cuda.amp import autocast`, `from torch.cuda import amp`, an
    alias). The report points at the call (or the decorator).

    ## Why is this bad?
    Since torch 2.4 each of them is a deprecated shim over `torch.amp`: every
    call emits `FutureWarning: torch.cuda.amp.autocast(args...) is deprecated.
    Please use torch.amp.autocast('cuda', args...) instead.` (the same for
    `GradScaler`, `custom_fwd`, `custom_bwd` and the `torch.cpu.amp` ones), once
    per process, so a job on 8 ranks prints it 8 times, and the shims are slated
    for removal. Nothing changes in what the training computes. A call that
    sits in a branch choosing between the old and the new API for old torch
    versions (`if is_torch_version(">=", "2.3")`, a `try:` around
    `torch.amp.GradScaler(...)`) is not reported, nor is any of it when the
    project pins a torch older than 2.4.

    ## Example
    ```python
    from torch.cuda.amp import GradScaler, autocast

    scaler = GradScaler()
    with autocast(dtype=torch.bfloat16):
        loss = model(batch)
    ```

    ## Use instead
    ```python
    from torch.amp import GradScaler, autocast

    scaler = GradScaler("cuda")
    with autocast("cuda", dtype=torch.bfloat16):
        loss = model(batch)
    ```

    ## Fix safety
    Safe: the shims only forward to the same `torch.amp` classes with the
    device type filled in (torch 2.13 source), so the fixed call builds the
    same object. `autocast`'s positional arguments are turned into keywords
    (`torch.cuda.amp.autocast(True)` becomes `torch.amp.autocast("cuda",
    enabled=True)`: the new second parameter is `dtype`); `GradScaler` keeps its
    positions after the new first parameter `device`; `custom_fwd`/`custom_bwd`
    get `device_type="cuda"` (a bare `@custom_fwd` becomes
    `@torch.amp.custom_fwd(device_type="cuda")`). A name imported from
    `torch.cuda.amp` is fixed in one edit with its import (`from torch.amp
    import ...`), and only when every use of the name in the file is such a
    call. The default `dtype` of `autocast` follows `torch.get_autocast_dtype`
    (float16 on CUDA and bfloat16 on CPU unless the script changed it with
    `torch.set_autocast_dtype`). There is no fix when the project allows a torch
    without the replacement (`GradScaler` before 2.3, `custom_fwd` before 2.4),
    for `*args`, or for a name also used in another way (passed as a value).

    ## References
    - torch 2.13 `torch/cuda/amp/autocast_mode.py`, `torch/cuda/amp/grad_scaler.py`, `torch/cpu/amp/*.py`
      (the deprecation messages)
    - [PyTorch AMP documentation](https://pytorch.org/docs/stable/amp.html)
    - [pytorch/tutorials#3331](https://github.com/pytorch/tutorials/issues/3331),
      [mit-han-lab/efficientvit#127](https://github.com/mit-han-lab/efficientvit/issues/127),
      [Linesight-RL/linesight#53](https://github.com/Linesight-RL/linesight/pull/53): the warning in user code
    - [NVIDIA/physicsnemo#1946](https://github.com/NVIDIA/physicsnemo/pull/1946): a hand migration that changed
      the import to `torch.amp` but left the calls without a device type (a TypeError)
    """

    code = "LD704"
    name = "deprecated-cuda-amp"
    severity = Severity.INFO
    fix_kind = "safe"
    triggers = ("cuda.amp", "cpu.amp", "cuda import amp", "cpu import amp")

    VALID = (
        Valid('import torch\n\nscaler = torch.amp.GradScaler("cuda")\nwith torch.amp.autocast("cuda"):\n    pass\n'),
        Valid(
            """\
import torch
from accelerate.utils import is_torch_version

if is_torch_version(">=", "2.3"):
    scaler = torch.amp.GradScaler("cuda")
else:
    scaler = torch.cuda.amp.GradScaler()
"""
        ),
        Valid(
            """\
import torch

try:
    scaler = torch.amp.GradScaler(device="cuda")
except (AttributeError, TypeError):
    scaler = torch.cuda.amp.GradScaler()
"""
        ),
        Valid(
            "import torch\n\nscaler = torch.cuda.amp.GradScaler()\n",
            project={"requirements.txt": "torch==2.1.2\n"},
        ),
        Valid(
            """\
import torch

TORCH_VERSION = tuple(int(p) for p in torch.__version__.split(".")[:2])
autocast = torch.amp.autocast if TORCH_VERSION >= (2, 4) else torch.cuda.amp.autocast


def run(model, x):
    if TORCH_VERSION < (2, 4):
        return torch.cuda.amp.GradScaler()
    return torch.amp.GradScaler("cuda")
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
import torch

scaler = torch.cuda.amp.GradScaler(enabled=use_amp)
with torch.cuda.amp.autocast(use_amp, torch.bfloat16):
    loss = model(x)
""",
            lines=(3, 4),
            fixed="""\
import torch

scaler = torch.amp.GradScaler("cuda", enabled=use_amp)
with torch.amp.autocast("cuda", enabled=use_amp, dtype=torch.bfloat16):
    loss = model(x)
""",
        ),
        Invalid(
            """\
from torch.cuda.amp import GradScaler, autocast

scaler = GradScaler(2.0**10)
with autocast():
    loss = model(x)
""",
            lines=(3, 4),
            fixed="""\
from torch.amp import GradScaler, autocast

scaler = GradScaler("cuda", 2.0**10)
with autocast("cuda"):
    loss = model(x)
""",
        ),
        Invalid(
            """\
import torch
from torch.cuda.amp import custom_bwd, custom_fwd


class Scale(torch.autograd.Function):
    @staticmethod
    @custom_fwd(cast_inputs=torch.float32)
    def forward(ctx, x):
        return x * 2

    @staticmethod
    @custom_bwd
    def backward(ctx, g):
        return g * 2
""",
            lines=(7, 12),
            fixed="""\
import torch
from torch.amp import custom_bwd, custom_fwd


class Scale(torch.autograd.Function):
    @staticmethod
    @custom_fwd(cast_inputs=torch.float32, device_type="cuda")
    def forward(ctx, x):
        return x * 2

    @staticmethod
    @custom_bwd(device_type="cuda")
    def backward(ctx, g):
        return g * 2
""",
        ),
        Invalid(
            "import torch\n\nscaler = torch.cuda.amp.GradScaler()\n",
            lines=(3,),
            project={"requirements.txt": "torch>=2.0\n"},
        ),
    )

    def finish(self) -> None:
        if self.versions.allows("torch", f">={DEPRECATED_SINCE}") is False:
            return  # every torch the project allows predates the deprecation
        facts = self.facts
        uses: list[tuple[cst.CSTNode, cst.BaseExpression, str, str]] = []  # (reported node, callee, kind, device)
        for call in facts.calls:
            found = deprecated_amp(facts, call.func)
            if found is not None:
                uses.append((call, call.func, *found))
        for decorator in facts.index.nodes(cst.Decorator):
            expr = decorator.decorator
            if isinstance(expr, (cst.Name, cst.Attribute)):
                found = deprecated_amp(facts, expr)
                if found is not None and found[0] in ("custom_fwd", "custom_bwd"):
                    uses.append((expr, expr, *found))
        uses = [use for use in uses if not chooses_api(facts, use[0], NEW_NAMES)]
        if not uses:
            return
        groups: dict[int, list] = {}
        for use in uses:
            groups.setdefault(id(self._import_of(use[1]) or use[0]), []).append(use)
        for group in groups.values():
            fix, why = self._group_fix(group)
            for node, _, kind, device in group:
                old = f"torch.{device}.amp.{kind}"
                message = (
                    f"`{old}` is deprecated (torch 2.13 warns with a FutureWarning on every rank); "
                    f"use `{_new_spelling(kind, device)}`"
                )
                if fix is None and why:
                    message += f" ({why})"
                self.report(node, message, fix=fix)

    # -- what is called ------------------------------------------------------------------------

    # -- imports -----------------------------------------------------------------------------------

    def _import_of(self, callee: cst.BaseExpression) -> cst.Import | cst.ImportFrom | None:
        """The import that binds the callee's first name to a deprecated module or class (not plain ``torch``)."""
        root = callee
        while isinstance(root, cst.Attribute):
            root = root.value
        if not isinstance(root, cst.Name) or self.facts.qualified_names(root) == {"torch"}:
            return None
        return binding_import(self.facts, root.value)

    # -- the fix ------------------------------------------------------------------------------------

    def _group_fix(self, group: list) -> tuple[Fix | None, str]:
        kinds = {kind for _, _, kind, _ in group}
        since = max((SINCE[kind] for kind in kinds), key=lambda v: tuple(map(int, v.split("."))))
        if self.versions.allows("torch", f"<{since}") is True:
            return None, f"no fix: the project allows a torch older than {since}, which lacks the replacement"
        statement = self._import_of(group[0][1])
        replacements: list[tuple[cst.CSTNode, cst.CSTNode]] = []
        if statement is not None:
            new_import = self._new_import(statement, group)
            if new_import is None:
                return None, "no fix: the imported name is also used in another way"
            replacements.append((statement, new_import))
        for node, callee, kind, device in group:
            new = _rewritten(node, callee, kind, device, renamed=statement is None, facts=self.facts)
            if new is None:
                return None, ""
            replacements.append((node, new))
        return Fix(
            Applicability.SAFE, "Use the `torch.amp` API with its device type", replacements=tuple(replacements)
        ), ""

    def _new_import(self, statement: cst.Import | cst.ImportFrom, group: list) -> cst.CSTNode | None:
        """The import rebound to ``torch.amp`` when every use of its names is one of ``group``'s callees."""
        callees = {id(callee) for _, callee, _, _ in group}
        moved = torch_amp_import(statement)
        if moved is None:
            return None
        new, binds_module = moved
        # every reading of a bound name must be a fixed callee (or, for a module, the receiver of one)
        for name in import_reads(self.facts, statement):
            if id(self.facts.parent(name) if binds_module else name) not in callees:
                return None
        return new


def _new_spelling(kind: str, device: str) -> str:
    if kind in ("autocast", "GradScaler"):
        return f'torch.amp.{kind}("{device}", ...)'
    return f'torch.amp.{kind}(..., device_type="{device}")'


def _rewritten(node, callee, kind, device, *, renamed: bool, facts) -> cst.CSTNode | None:
    """The call (or decorator expression) ``node`` with the ``torch.amp`` callee and its device argument."""
    new_callee = callee
    if renamed:  # `torch.cuda.amp.autocast` spelled in full: its root name stays (an alias of torch)
        root = callee
        while isinstance(root, cst.Attribute):
            root = root.value
        if not isinstance(root, cst.Name) or facts.qualified_names(root) != {"torch"}:
            return None
        new_callee = cst.Attribute(value=cst.Attribute(value=root, attr=cst.Name("amp")), attr=cst.Name(kind))
    device_string = cst.SimpleString(f'"{device}"')
    if not isinstance(node, cst.Call):  # a bare `@custom_fwd`
        return cst.Call(func=new_callee, args=[keyword_arg("device_type", device_string)])
    args = list(node.args)
    if any(arg.star == "*" for arg in args):
        return None
    if kind in ("custom_fwd", "custom_bwd"):
        return with_arg_appended(node.with_changes(func=new_callee), keyword_arg("device_type", device_string))
    if kind == "autocast":
        for index, arg in enumerate(args):
            if arg.keyword is None and not arg.star:
                if index >= len(AUTOCAST_POSITIONS):
                    return None
                named = keyword_arg(AUTOCAST_POSITIONS[index], arg.value)
                args[index] = named.with_changes(comma=arg.comma, whitespace_after_arg=arg.whitespace_after_arg)
    return with_arg_first(node.with_changes(func=new_callee, args=args), cst.Arg(value=device_string))
