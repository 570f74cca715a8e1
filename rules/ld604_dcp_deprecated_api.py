"""LD604 dcp-deprecated-api: `torch.distributed.checkpoint.save_state_dict`/`load_state_dict` -> `save`/`load`."""

from __future__ import annotations

import libcst as cst

from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Rule, Valid
from lintdist.spelling import variable_spelled

DCP = "torch.distributed.checkpoint"
# torch 2.13: `save_state_dict(state_dict, storage_writer, process_group=None, coordinator_rank=0, no_dist=False,
# planner=None)` in `state_dict_saver.py`, `load_state_dict(state_dict, storage_reader, ...)` the same in
# `state_dict_loader.py`, both `@deprecated(..., category=FutureWarning)`; their successors `save`/`load`
# (torch >= 2.2) take `state_dict` positionally and everything else by keyword only, with no `coordinator_rank`.
OLD = {
    f"{DCP}.save_state_dict": ("save", "storage_writer"),
    f"{DCP}.state_dict_saver.save_state_dict": ("save", "storage_writer"),
    f"{DCP}.load_state_dict": ("load", "storage_reader"),
    f"{DCP}.state_dict_loader.load_state_dict": ("load", "storage_reader"),
    # the old package name, which torch 2.13 keeps as an alias of `torch.distributed.checkpoint`
    # (`torch/distributed/_shard/checkpoint/__init__.py` replaces itself in `sys.modules`)
    "torch.distributed._shard.checkpoint.save_state_dict": ("save", "storage_writer"),
    "torch.distributed._shard.checkpoint.load_state_dict": ("load", "storage_reader"),
}
OLD_NAMES = frozenset(OLD)


def _parameters(storage: str) -> tuple[str, ...]:
    return ("state_dict", storage, "process_group", "coordinator_rank", "no_dist", "planner")


class DcpDeprecatedApi(Rule):
    """
    ## What it does
    Reports calls of `torch.distributed.checkpoint.save_state_dict` and
    `load_state_dict` (under any alias: `dcp.save_state_dict`, a from-import,
    or the old package name `torch.distributed._shard.checkpoint`, which torch
    keeps as an alias of `torch.distributed.checkpoint`)
    and rewrites them to `dcp.save` / `dcp.load`. `model.load_state_dict` and
    other methods of the same name are not concerned: the callee is resolved
    through the imports. Nothing is reported when the project pins
    torch < 2.2, where `save`/`load` do not exist.

    ## Why is this bad?
    Both functions are deprecated (`FutureWarning`: "will be removed in
    future versions", torch 2.2 to 2.13). Two spellings fail outright (error):
    - `checkpoint_id=` (the argument of the new API) raises `TypeError:
      unexpected keyword argument 'checkpoint_id'`;
    - a path given as the second positional argument (a string literal, an
      f-string) is taken as the `storage_writer`/`storage_reader` and fails
      with `AttributeError: 'str' object has no attribute 'reset'`.
    The other calls only warn (warning severity). The new API also accepts a
    path as `checkpoint_id=`, detects an uninitialised process group (the old
    one needs `no_dist=True`) and handles `Stateful` objects.

    ## Example
    ```python
    import torch.distributed.checkpoint as dcp

    dcp.save_state_dict(state, dcp.FileSystemWriter(path))
    dcp.load_state_dict(state, checkpoint_id=path)
    ```

    ## Use instead
    ```python
    import torch.distributed.checkpoint as dcp

    dcp.save(state, storage_writer=dcp.FileSystemWriter(path))
    dcp.load(state, checkpoint_id=path)
    ```

    ## Fix safety
    Safe: the callee becomes `save`/`load` of the same module, the
    positional arguments after `state_dict` become keywords
    (`storage_writer`/`storage_reader`, `process_group`, `no_dist`,
    `planner`), and a string literal given as the storage becomes
    `checkpoint_id=`. A literal `coordinator_rank=0` (the only value `save`
    uses) is dropped. No fix with any other `coordinator_rank`, with `*args`
    or `**kwargs`, or when the call is a bare `save_state_dict(...)` name in a
    file that already uses the name `save`/`load` (the new import would
    shadow it).

    ## References
    - torch `torch/distributed/checkpoint/state_dict_saver.py` and `state_dict_loader.py` (`@deprecated`)
    - pytorch/pytorch#113867 (the `save`/`load` API and the deprecation, torch 2.2)
    - Lightning-AI/pytorch-lightning#19462 (FSDP checkpointing uses deprecated APIs with PyTorch 2.2)
    - pytorch/xla#6773, awslabs/awsome-distributed-ai#710 (moving off `save_state_dict`)
    - [torch.distributed.checkpoint docs](https://pytorch.org/docs/stable/distributed.checkpoint.html)
    """

    code = "LD604"
    name = "dcp-deprecated-api"
    severity = Severity.ERROR
    fix_kind = "safe"
    triggers = ("save_state_dict", "load_state_dict")
    # ... and the module, imported or spelled out (`load_state_dict` alone is every model's method)
    also_triggers = (
        ("distributed.checkpoint", "distributed import checkpoint", "_shard.checkpoint", "_shard import checkpoint"),
    )

    VALID = (
        Valid("import torch.distributed.checkpoint as dcp\n\ndcp.save(state, checkpoint_id=path)\n"),
        Valid(
            "import torch\nimport torch.distributed.checkpoint as dcp\n\n"
            "model.load_state_dict(torch.load(path))\noptimizer.load_state_dict(state)\n"
        ),
        Valid(
            "import torch.distributed.checkpoint as dcp\n\ndcp.save_state_dict(state, dcp.FileSystemWriter(path))\n",
            project={"requirements.txt": "torch==2.1.2\n"},
        ),
    )
    INVALID = (
        Invalid(
            "import torch.distributed.checkpoint as dcp\n\ndcp.save_state_dict(state, dcp.FileSystemWriter(path))\n",
            lines=(3,),
            fixed=(
                "import torch.distributed.checkpoint as dcp\n\n"
                "dcp.save(state, storage_writer=dcp.FileSystemWriter(path))\n"
            ),
        ),
        Invalid(
            "import torch.distributed.checkpoint as dcp\n\ndcp.load_state_dict(state, checkpoint_id=path)\n",
            lines=(3,),
            fixed="import torch.distributed.checkpoint as dcp\n\ndcp.load(state, checkpoint_id=path)\n",
        ),
        Invalid(
            "from torch.distributed.checkpoint import save_state_dict\n\n"
            "save_state_dict(state, 'ckpt/step1', None, 0, True)\n",
            lines=(3,),
            fixed=(
                "from torch.distributed.checkpoint import save\n\n"
                "save(state, checkpoint_id='ckpt/step1', process_group=None, no_dist=True)\n"
            ),
        ),
        Invalid(
            "import torch.distributed.checkpoint as dcp\n\ndcp.load_state_dict(state, reader, coordinator_rank=1)\n",
            lines=(3,),
        ),
        Invalid(
            "from torch.distributed.checkpoint import save_state_dict\n\n\n"
            "def save(state, writer):\n    save_state_dict(state, writer)\n",
            lines=(5,),
        ),
    )

    def finish(self) -> None:
        if self.versions.allows("torch", ">=2.2") is False:
            return  # `save`/`load` do not exist there
        facts = self.facts
        for call in facts.calls:
            if not facts.callee_is(call, OLD_NAMES):
                continue
            old = next(name for name in facts.qualified_names(call.func) if name in OLD)
            new, storage = OLD[old]
            fails = _failure(call, storage)
            old_short = old.rsplit(".", 1)[1]
            if fails:
                message = f"`{old_short}` {fails}; `dcp.{old_short}` is deprecated: call `dcp.{new}`"
            else:
                message = (
                    f"`dcp.{old_short}` is deprecated since torch 2.2 (FutureWarning, to be removed): "
                    f"call `dcp.{new}(state_dict, checkpoint_id=... or {storage}=...)`"
                )
            self.report(
                call,
                message,
                fix=self._fix(call, new, storage, old.rsplit(".", 1)[0]),
                severity=Severity.ERROR if fails else Severity.WARNING,
            )

    def _fix(self, call: cst.Call, new: str, storage: str, module: str) -> Fix | None:
        args = _rewritten(call, storage)
        if args is None:
            return None
        func = call.func
        imports: tuple[tuple[str, str], ...] = ()
        stale: tuple[tuple[str, str], ...] = ()
        if isinstance(func, cst.Attribute):
            func = func.with_changes(attr=cst.Name(new))
        elif isinstance(func, cst.Name):
            func_name = func.value
            if variable_spelled(self.facts, new):
                return None  # `from ... import save` would shadow (or be shadowed by) the file's own `save`
            func = cst.Name(new)
            imports = ((DCP, new),)
            if func_name in {"save_state_dict", "load_state_dict"}:  # not an alias: drop it once unused
                stale = ((module, func_name),)
        else:
            return None
        return Fix(
            Applicability.SAFE,
            f"Call `{new}` with keyword arguments",
            replacements=((call, call.with_changes(func=func, args=args)),),
            imports=imports,
            stale_imports=stale,
        )


def _failure(call: cst.Call, storage: str) -> str | None:
    """Why this call raises in torch 2.13, or None when it only warns."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "checkpoint_id":
            return "has no `checkpoint_id` parameter: this call raises TypeError"
    positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
    if len(positional) > 1 and _is_string(positional[1].value):
        return (
            f"takes a `{storage}` object as its second argument, not a path: this call raises AttributeError "
            "(`'str' object has no attribute 'reset'`)"
        )
    return None


def _is_string(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString))


def _rewritten(call: cst.Call, storage: str) -> list[cst.Arg] | None:
    """The arguments for `save`/`load`: all but `state_dict` by keyword, `coordinator_rank=0` dropped."""
    names = _parameters(storage)
    args: list[cst.Arg] = []
    position = 0
    for arg in call.args:
        if arg.star:
            return None
        name = arg.keyword.value if arg.keyword is not None else None
        if name is None:
            if position >= len(names):
                return None
            name = names[position]
            position += 1
        if name == "coordinator_rank":
            if isinstance(arg.value, cst.Integer) and arg.value.value == "0":
                continue
            return None
        if name == storage and arg.keyword is None and _is_string(arg.value):
            name = "checkpoint_id"
        if name == "state_dict" and arg.keyword is None:
            args.append(arg)
            continue
        args.append(
            arg.with_changes(
                keyword=cst.Name(name),
                equal=cst.AssignEqual(
                    whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
                ),
            )
        )
    if args and call.args:
        args[-1] = args[-1].with_changes(comma=call.args[-1].comma)
    return args
