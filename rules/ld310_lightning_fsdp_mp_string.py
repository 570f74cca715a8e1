"""LD310 lightning-fsdp-mp-string: Lightning's `FSDPStrategy(mixed_precision="bf16")`, a string where FSDP
needs a `MixedPrecision` object.

Lightning 2.6 (`lightning/pytorch/strategies/fsdp.py` and `lightning/fabric/strategies/fsdp.py`) stores the
keyword as given; `mixed_precision_config` returns it whenever it is truthy, before it looks at the precision
plugin, and `_setup_model`/`setup_module` pass it to `FullyShardedDataParallel(mixed_precision=...)`, whose
`_init_core_state` reads `.param_dtype` from it.
"""

from __future__ import annotations

import libcst as cst

from lintdist.edits import keyword_arg, without_argument
from lintdist.facts import FABRIC_CLASSES, LIGHTNING_TRAINERS, argument_of, string_value
from lintdist.model import Applicability, Fix, Severity
from lintdist.receivers import receiving_calls
from lintdist.rule import Invalid, Rule, Valid


def _names(name: str, *modules: str) -> frozenset[str]:
    return frozenset(f"{module}.{name}" for module in modules)


STRATEGY_CLASSES = _names(
    "FSDPStrategy",
    "lightning.pytorch.strategies",
    "lightning.pytorch.strategies.fsdp",
    "lightning.fabric.strategies",
    "lightning.fabric.strategies.fsdp",
    "pytorch_lightning.strategies",
    "pytorch_lightning.strategies.fsdp",
    "lightning_fabric.strategies",
    "lightning_fabric.strategies.fsdp",
)
TRAINER_CLASSES = LIGHTNING_TRAINERS
RUNNER_CLASSES = TRAINER_CLASSES | FABRIC_CLASSES | frozenset({"lightning.fabric.fabric.Fabric"})
KEYWORD = "mixed_precision"

# The string an author wrote -> the Trainer/Fabric `precision=` that asks for it. Lightning's FSDPPrecision turns
# that precision into the FSDP `MixedPrecision` the string meant (`mixed_precision_config`, all three dtypes).
PRECISION_FOR = {
    "bf16": "bf16-mixed",
    "bfloat16": "bf16-mixed",
    "bf16-mixed": "bf16-mixed",
    "16": "16-mixed",
    "fp16": "16-mixed",
    "float16": "16-mixed",
    "16-mixed": "16-mixed",
    "bf16-true": "bf16-true",
    "16-true": "16-true",
}
# Strings that ask for full precision: the default precision ("32-true") gives exactly that, so the keyword can
# go with nothing added.
FULL_PRECISION = frozenset({"32", "fp32", "float32", "32-true", "no"})


class LightningFsdpMpString(Rule):
    """
    ## What it does
    Reports `FSDPStrategy(mixed_precision="bf16")` (any string) from
    `lightning.pytorch.strategies`, `lightning.fabric.strategies` or
    `pytorch_lightning.strategies`, under any import spelling or alias
    (`import lightning as L; L.pytorch.strategies.FSDPStrategy(...)`), whether
    the string is written in the call, held by a variable, or given through
    `**kwargs` from a literal dict. The report points at the keyword (or the
    dict entry).

    ## Why is this bad?
    `mixed_precision` takes a `torch.distributed.fsdp.MixedPrecision` object.
    Lightning does not convert a string: the strategy's
    `mixed_precision_config` returns the keyword whenever it is set, before it
    consults the precision plugin, and hands it to
    `FullyShardedDataParallel(mixed_precision=...)`, which fails while the
    model is wrapped with `AttributeError: 'str' object has no attribute
    'param_dtype'`. So the run crashes at `trainer.fit` / `fabric.setup`, and
    the `precision=` given to the `Trainer` or `Fabric` is never used, since an
    explicit strategy value wins over the plugin. An empty string is
    falsy and skipped by Lightning, so it is not reported.

    ## Example
    ```python
    import lightning as L
    from lightning.pytorch.strategies import FSDPStrategy

    trainer = L.Trainer(devices=4, strategy=FSDPStrategy(mixed_precision="bf16"))
    ```

    ## Use instead
    ```python
    import lightning as L
    from lightning.pytorch.strategies import FSDPStrategy

    trainer = L.Trainer(devices=4, strategy=FSDPStrategy(), precision="bf16-mixed")
    ```
    Lightning's FSDP precision plugin builds the `MixedPrecision` for
    `precision="bf16-mixed"` (parameters, gradient reduction and buffers in
    bfloat16) and adds autocast. To set the dtypes one by one, pass
    `mixed_precision=MixedPrecision(param_dtype=..., reduce_dtype=...,
    buffer_dtype=...)` instead.

    ## Fix safety
    Safe. The fix deletes the keyword. When the `Trainer(...)` or `Fabric(...)`
    the strategy is passed to (found in the same file, through names and
    local functions) has no `precision=`, it adds the one the string meant:
    `"bf16-mixed"` for `bf16`/`bfloat16`, `"16-mixed"` for `16`/`fp16`/`float16`,
    and Lightning's own spellings (`"bf16-mixed"`, `"16-true"`...) as written.
    A full-precision string (`"32"`, `"fp32"`, `"float32"`, `"32-true"`)
    needs nothing added: the default precision is full precision. When the
    `Trainer` already has a `precision=`, only the keyword goes and that
    precision, the only one that could ever run, decides. No fix when no
    `Trainer`/`Fabric` in the file (or more than one) receives the strategy,
    when it says `precision=None`, for other strings, for a value that is a
    string on one path only, and for the dict shape; and no `precision=` is
    added (so no fix for a string that needs one) when the call's keywords
    come in part from `**kwargs` (they may hold `precision`), or when the call
    also receives another strategy on some path (its run would change).

    ## References
    - Lightning `lightning/pytorch/strategies/fsdp.py` and `lightning/fabric/strategies/fsdp.py`:
      `FSDPStrategy.mixed_precision_config`, `_setup_model` / `setup_module`
    - Lightning `lightning/pytorch/plugins/precision/fsdp.py`: `FSDPPrecision.mixed_precision_config`
    - PyTorch `torch/distributed/fsdp/_init_utils.py`: `_init_core_state` and the `param_dtype` reads
    - [Lightning: FSDP mixed precision](https://lightning.ai/docs/pytorch/stable/advanced/model_parallel/fsdp.html)
    """

    code = "LD310"
    name = "lightning-fsdp-mp-string"
    severity = Severity.ERROR
    fix_kind = "safe"
    triggers = ("FSDPStrategy",)

    VALID = (
        Valid(
            """\
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.strategies import FSDPStrategy
from torch.distributed.fsdp import MixedPrecision

policy = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
trainer = Trainer(devices=2, strategy=FSDPStrategy(mixed_precision=policy))
"""
        ),
        Valid(
            """\
from lightning.fabric import Fabric
from lightning.fabric.strategies import FSDPStrategy

fabric = Fabric(devices=2, strategy=FSDPStrategy(mixed_precision=None), precision="bf16-mixed")
"""
        ),
        Valid(
            """\
from lightning.pytorch.strategies import FSDPStrategy

strategy = FSDPStrategy(mixed_precision=args.mixed_precision, sharding_strategy="SHARD_GRAD_OP")
"""
        ),
        Valid(
            """\
from lightning.pytorch.strategies import DDPStrategy

strategy = DDPStrategy(mixed_precision="bf16")
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
import lightning as L
from lightning.pytorch.strategies import FSDPStrategy

trainer = L.Trainer(devices=4, strategy=FSDPStrategy(mixed_precision="bf16", cpu_offload=False))
""",
            lines=(4,),
            fixed="""\
import lightning as L
from lightning.pytorch.strategies import FSDPStrategy

trainer = L.Trainer(devices=4, strategy=FSDPStrategy(cpu_offload=False), precision="bf16-mixed")
""",
        ),
        Invalid(
            """\
import pytorch_lightning as pl
from pytorch_lightning.strategies import FSDPStrategy as Sharded

strategy = Sharded(
    auto_wrap_policy={Block},
    mixed_precision="fp16",
)
trainer = pl.Trainer(
    accelerator="gpu",
    strategy=strategy,
)
""",
            lines=(6,),
            fixed="""\
import pytorch_lightning as pl
from pytorch_lightning.strategies import FSDPStrategy as Sharded

strategy = Sharded(
    auto_wrap_policy={Block},
)
trainer = pl.Trainer(
    accelerator="gpu",
    strategy=strategy,
    precision="16-mixed",
)
""",
        ),
        Invalid(
            """\
import lightning as L

strategy = L.fabric.strategies.FSDPStrategy(mixed_precision="bfloat16")
fabric = L.Fabric(devices=8, strategy=strategy, precision="16-mixed")
""",
            lines=(3,),
            fixed="""\
import lightning as L

strategy = L.fabric.strategies.FSDPStrategy()
fabric = L.Fabric(devices=8, strategy=strategy, precision="16-mixed")
""",
        ),
        Invalid(
            """\
from lightning.pytorch import Trainer
from lightning.pytorch.strategies import FSDPStrategy

strategy = FSDPStrategy(mixed_precision="bf16") if devices > 1 else "auto"
trainer = Trainer(devices=devices, strategy=strategy)
""",
            lines=(4,),
        ),
    )

    def finish(self) -> None:
        facts = self.facts
        for call in facts.calls:
            if not facts.callee_is(call, STRATEGY_CLASSES):
                continue
            value = argument_of(call, KEYWORD, None)
            if value is not None:
                self._check_keyword(call, next(a for a in call.args if a.value is value))
            for arg in call.args:
                if arg.star == "**":
                    self._check_dict(call, arg.value)

    # -- the keyword ------------------------------------------------------------------------

    def _check_keyword(self, strategy: cst.Call, arg: cst.Arg) -> None:
        strings = self._strings(arg.value)
        if strings is None or not any(strings):
            return
        written = next(s for s in strings if s)
        message = _message(written)
        fix = self._fix(strategy, arg, strings) if all(strings) and len(set(strings)) == 1 else None
        self.report(arg, message, fix=fix)

    def _strings(self, value: cst.BaseExpression) -> list[str | None] | None:
        """The string each origin of the value is (None for an origin that is not a string literal); None when
        no origin is a non-empty string."""
        origins = self.facts.origins(value)
        found = [string_value(o.node) if o.index is None else None for o in origins]
        return found if any(found) else None

    def _check_dict(self, strategy: cst.Call, expr: cst.BaseExpression) -> None:
        """``FSDPStrategy(**config)`` where ``config`` is a literal dict (or ``dict(...)``) with the string."""
        for origin in self.facts.origins(expr, strategy):
            node = origin.node
            if origin.index is not None:
                continue
            if isinstance(node, cst.Dict):
                entries = [(e, string_value(e.key)) for e in node.elements if isinstance(e, cst.DictElement)]
            elif _is_builtin_dict(node):
                entries = [(a, a.keyword.value) for a in node.args if a.keyword is not None]
            else:
                continue
            for entry, key in entries:
                written = string_value(entry.value) if key == KEYWORD else None
                if written:
                    self.report(entry, _message(written) + " (it reaches the strategy through `**`)")

    # -- the fix ----------------------------------------------------------------------------

    def _fix(self, strategy: cst.Call, arg: cst.Arg, strings: list[str]) -> Fix | None:
        written = strings[0].strip().lower()
        precision = PRECISION_FOR.get(written)
        if precision is None and written not in FULL_PRECISION:
            return None
        new_strategy = without_argument(strategy, arg)
        if new_strategy is None:
            return None
        runners = receiving_calls(self.facts, strategy, RUNNER_CLASSES, "strategy")
        if len(runners) != 1:
            return None
        runner, strategy_arg = runners[0]
        stars = any(a.star for a in runner.args)
        given = next((a for a in runner.args if a.keyword is not None and a.keyword.value == "precision"), None)
        if given is not None:
            if isinstance(given.value, cst.Name) and given.value.value == "None":
                return None  # the default: a second keyword would not parse, and None is what adding would replace
            text = self.context.module.code_for_node(given.value)
            return self._removal(strategy, new_strategy, f"Remove `mixed_precision`; the `precision={text}` decides")
        if precision is None:  # full precision: the default precision already gives it (or `**kwargs`' precision)
            return self._removal(strategy, new_strategy, "Remove `mixed_precision` (full precision is the default)")
        if stars or not self._only_this_strategy(strategy_arg, runner, strategy):
            return None  # `**kwargs` may hold `precision` already; another strategy's run would get it too
        precision_arg = keyword_arg("precision", cst.SimpleString(f'"{precision}"'))
        if strategy_arg.value is strategy:  # written inline: one replacement of the runner holds both edits
            inner = runner.with_changes(
                args=[a.with_changes(value=new_strategy) if a is strategy_arg else a for a in runner.args]
            )
            new_runner = _append_argument(inner, precision_arg)
            replacements = ((runner, new_runner),)
        else:
            if self.facts.is_within(runner, strategy) or self.facts.is_within(strategy, runner):
                return None
            replacements = ((strategy, new_strategy), (runner, _append_argument(runner, precision_arg)))
        return Fix(
            Applicability.SAFE,
            f'Remove `mixed_precision` and pass `precision="{precision}"` to the `{_last(runner)}`',
            replacements=replacements,
        )

    def _removal(self, strategy: cst.Call, new_strategy: cst.Call, message: str) -> Fix:
        return Fix(Applicability.SAFE, message, replacements=((strategy, new_strategy),))

    def _only_this_strategy(self, strategy_arg: cst.Arg, runner: cst.Call, strategy: cst.Call) -> bool:
        origins = self.facts.origins(strategy_arg.value, runner)
        return bool(origins) and all(o.node is strategy and o.index is None for o in origins)


def _message(written: str) -> str:
    key = written.strip().lower()
    if key in PRECISION_FOR:
        use = f'remove it and pass `precision="{PRECISION_FOR[key]}"` to the `Trainer`/`Fabric`'
    elif key in FULL_PRECISION:
        use = "remove it: full precision is the default"
    else:
        use = "remove it and pass `precision=` to the `Trainer`/`Fabric`, or pass a `torch.distributed.fsdp.MixedPrecision(...)`"
    return (
        f"`FSDPStrategy(mixed_precision={written!r})`: Lightning forwards the string to FSDP unchanged, which raises "
        f"`AttributeError: 'str' object has no attribute 'param_dtype'` when the model is wrapped (a strategy value "
        f"also overrides the `precision=` of the `Trainer`/`Fabric`); {use}"
    )


def _is_builtin_dict(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "dict"


def _last(call: cst.Call) -> str:
    func = call.func
    return func.attr.value if isinstance(func, cst.Attribute) else getattr(func, "value", "Trainer")


def _append_argument(call: cst.Call, new: cst.Arg) -> cst.Call:
    """``call`` with ``new`` as its last argument, in the call's layout: on its own line when the arguments are
    one per line (keeping a trailing comma and the last argument's comment where they were), else after ", "."""
    args = list(call.args)  # never empty: the call is given the strategy
    last = args[-1]
    if len(args) >= 2 and isinstance(args[-2].comma, cst.Comma):
        separator = args[-2].comma.whitespace_after
    else:
        separator = call.whitespace_before_args
    if not isinstance(separator, cst.ParenthesizedWhitespace):
        separator = cst.SimpleWhitespace(" ")
    if isinstance(last.comma, cst.Comma):
        closing = last.comma.whitespace_after  # what follows the trailing comma, up to `)`
        if isinstance(separator, cst.ParenthesizedWhitespace) and isinstance(closing, cst.ParenthesizedWhitespace):
            # the last argument keeps its own comment; the new one ends the line as the old last did, uncommented
            kept = separator.with_changes(first_line=closing.first_line, empty_lines=closing.empty_lines)
            new = new.with_changes(
                comma=last.comma.with_changes(
                    whitespace_after=closing.with_changes(first_line=cst.TrailingWhitespace(), empty_lines=[])
                )
            )
            last = last.with_changes(comma=last.comma.with_changes(whitespace_after=kept))
        else:
            new = new.with_changes(comma=last.comma)
            last = last.with_changes(comma=cst.Comma(whitespace_after=separator))
    else:
        closing = last.whitespace_after_arg  # what follows the last argument, up to `)`
        kept = separator
        if isinstance(separator, cst.ParenthesizedWhitespace) and isinstance(closing, cst.ParenthesizedWhitespace):
            kept = separator.with_changes(first_line=closing.first_line, empty_lines=closing.empty_lines)
            closing = closing.with_changes(first_line=cst.TrailingWhitespace(), empty_lines=[])
        new = new.with_changes(whitespace_after_arg=closing)
        last = last.with_changes(comma=cst.Comma(whitespace_after=kept), whitespace_after_arg=cst.SimpleWhitespace(""))
    return call.with_changes(args=[*args[:-1], last, new])
