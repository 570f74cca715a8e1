"""LD404 gather-for-metrics: `accelerator.gather` of per-sample eval results keeps the last batch's duplicates."""

from __future__ import annotations

import re

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.accelerators import even_batches_off
from lintdist.batch_rows import batch_derived, generated, mentions, per_sample_rows, rows_cut
from lintdist.facts import iterated_expression
from lintdist.loaders import drops_last, eval_mode_set, evaluation_function, prepared_origin
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Pattern, Rule, Valid

# Loader names that say they hold evaluation data.
EVALUATION_LOADER_WORDS = ("eval", "val", "test", "dev", "predict")


class GatherForMetrics(Rule):
    """
    ## What it does
    Reports `accelerator.gather(x)` inside a loop over an evaluation loader
    prepared by accelerate, where `x` holds one row per sample of the batch
    (predictions, logits, labels, generated ids). The loop evaluates: it
    runs no backward and sits under `no_grad`/`inference_mode`, after
    `model.eval()`, in a function named for evaluation, or over a loader
    named for it (`eval_dataloader`, `test_loader`). The loop may be in a
    trainer method (`self.accelerator`, `self.eval_dataloader`) or in a
    helper that receives the prepared loader from another module.

    Not reported: a 0-d value such as a mean loss or a batch accuracy, a
    per-batch scalar copied per sample (`loss.repeat(bs)`), a gather
    outside a loader loop or in a training loop, a gather whose result is
    then cut to the dataset's length (`preds[: len(loader.dataset) -
    samples_seen]`), and loaders with no duplicates: not prepared,
    `drop_last=True`, or an `Accelerator` whose
    `DataLoaderConfiguration(even_batches=False)` (or `accelerator.even_batches
    = False`) turns the padding off. A generation output gathered without
    `pad_across_processes` (by `gather` or `gather_for_metrics`) is LD410's
    (all-gather-uneven-shapes); a finding here then also says to pad it.

    ## Why is this bad?
    A prepared loader gives every rank the same number of full batches
    (`even_batches=True`, the default): when the dataset does not divide by
    `num_processes * batch_size`, the last batch is completed with samples
    from the start of the dataset. `gather` returns them too, so the metric
    counts some samples twice (an 11-sample eval set on 2 ranks with batch
    size 3 gathers 12 predictions). `gather_for_metrics` drops the
    duplicates of the last batch (`gradient_state.remainder`).

    ## Example
    ```python
    model, eval_loader = accelerator.prepare(model, eval_loader)
    model.eval()
    for batch in eval_loader:
        with torch.no_grad():
            logits = model(batch["x"])
        preds = accelerator.gather(logits.argmax(-1))
        metric.add_batch(predictions=preds, references=accelerator.gather(batch["y"]))
    ```

    ## Use instead
    ```python
    model, eval_loader = accelerator.prepare(model, eval_loader)
    model.eval()
    for batch in eval_loader:
        with torch.no_grad():
            logits = model(batch["x"])
        preds = accelerator.gather_for_metrics(logits.argmax(-1))
        metric.add_batch(predictions=preds, references=accelerator.gather_for_metrics(batch["y"]))
    ```

    ## Fix safety
    Safe. `gather_for_metrics` calls `gather` and, at the last batch of the
    loader only, keeps the first `remainder` rows of every tensor; on every
    other batch the result is the same. There is no fix when `x` went
    through a reshape (`view`, `flatten`, a boolean mask) in the loop: its
    first dimension is then no longer the sample, and the truncation would
    cut the wrong rows; gather the per-sample tensor before flattening it.

    ## References
    - accelerate `Accelerator.gather_for_metrics` and `GradientState.remainder`
      (`data_loader.py`: `remainder = length % total_batch_size`)
    - accelerate `examples/by_feature/multi_process_metrics.py` (the manual
      `samples_seen` truncation that `gather_for_metrics` replaces)
    - huggingface/accelerate#350 "Evaluation could have duplicated validation
      data" (22 samples on 3 ranks with batch size 8 gather as 24)
    - huggingface/accelerate#540 "Add a gather_for_metrics capability" (the
      pull request that added it to replace the manual truncation)
    """

    code = "LD404"
    name = "gather-for-metrics"
    severity = Severity.WARNING
    needs_several_processes = True
    fix_kind = "safe"
    # one argument, not torch's `torch.gather(t, ...)` nor `x.gather(dim, index)` (`gather(1, idx)`, `gather(dim=...)`)
    triggers = (
        ".gather_for_metrics(",
        Pattern((".gather(",), re.compile(r"\.gather\((?<!torch\.gather\()(?!\s*(?:-?\d|dim\b|input=))")),
    )
    also_triggers = (("accelerat",),)

    VALID = (
        Valid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
model, eval_loader = accelerator.prepare(model, eval_loader)
model.eval()
for batch in eval_loader:
    with torch.no_grad():
        loss = model(**batch).loss
    losses.append(accelerator.gather(loss))
"""
        ),
        Valid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
model, eval_loader = accelerator.prepare(model, eval_loader)
model.eval()
seen = 0
for step, batch in enumerate(eval_loader):
    with torch.no_grad():
        preds = model(**batch).logits.argmax(-1)
    preds = accelerator.gather(preds)
    if step == len(eval_loader) - 1:
        preds = preds[: len(eval_loader.dataset) - seen]
    seen += preds.shape[0]
    metric.add_batch(predictions=preds)
"""
        ),
        Valid(
            """\
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration

accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(even_batches=False))
model, eval_loader = accelerator.prepare(model, eval_loader)
model.eval()
for batch in eval_loader:
    with torch.no_grad():
        preds = model(**batch).logits.argmax(-1)
    metric.add_batch(predictions=accelerator.gather(preds))
"""
        ),
        Valid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
model, train_loader = accelerator.prepare(model, train_loader)
for batch in train_loader:
    loss = model(**batch).loss
    accelerator.backward(loss)
    logged = accelerator.gather(model(**batch).logits)
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
model, eval_loader = accelerator.prepare(model, eval_loader)
model.eval()
for batch in eval_loader:
    with torch.no_grad():
        logits = model(batch["x"])
    preds, refs = accelerator.gather((logits.argmax(-1), batch["y"]))
    metric.add_batch(predictions=preds, references=refs)
""",
            lines=(9,),
            fixed="""\
from accelerate import Accelerator

accelerator = Accelerator()
model, eval_loader = accelerator.prepare(model, eval_loader)
model.eval()
for batch in eval_loader:
    with torch.no_grad():
        logits = model(batch["x"])
    preds, refs = accelerator.gather_for_metrics((logits.argmax(-1), batch["y"]))
    metric.add_batch(predictions=preds, references=refs)
""",
        ),
        Invalid(
            """\
from accelerate import Accelerator


class Trainer:
    def __init__(self, model, loader):
        self.accelerator = Accelerator()
        self.model, self.eval_loader = self.accelerator.prepare(model, loader)

    @torch.no_grad()
    def evaluate(self):
        correct = 0
        for batch in self.eval_loader:
            preds = self.model(batch["x"]).argmax(-1)
            correct += (self.accelerator.gather(preds) == self.accelerator.gather(batch["y"])).sum()
        return correct
""",
            lines=(14, 14),
            fixed="""\
from accelerate import Accelerator


class Trainer:
    def __init__(self, model, loader):
        self.accelerator = Accelerator()
        self.model, self.eval_loader = self.accelerator.prepare(model, loader)

    @torch.no_grad()
    def evaluate(self):
        correct = 0
        for batch in self.eval_loader:
            preds = self.model(batch["x"]).argmax(-1)
            correct += (self.accelerator.gather_for_metrics(preds) == self.accelerator.gather_for_metrics(batch["y"])).sum()
        return correct
""",
        ),
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
model, eval_loader = accelerator.prepare(model, eval_loader)
model.eval()
for batch in eval_loader:
    with torch.no_grad():
        tokens = model(batch["x"]).argmax(-1).view(-1)
    all_tokens.append(accelerator.gather(tokens))
""",
            lines=(9,),
        ),
    )

    def finish(self) -> None:
        facts = self.facts
        for call in facts.calls:
            func = call.func
            if not isinstance(func, cst.Attribute) or func.attr.value not in {"gather", "gather_for_metrics"}:
                continue
            if len(call.args) != 1 or call.args[0].keyword is not None or call.args[0].star:
                continue
            if not self._accelerator(func.value, call):
                continue
            found = self._eval_loop(call)
            if found is None:
                continue
            loop, prepared = found
            derived = batch_derived(facts, loop)
            value = call.args[0].value
            if not mentions(facts, value, derived):
                continue
            kind = per_sample_rows(facts, value, loop, derived, call)
            if kind is None:
                continue
            unpadded = generated(facts, value, loop)
            duplicates = (
                func.attr.value == "gather"
                and not even_batches_off(facts, self.settings)
                and (prepared is None or not drops_last(facts, prepared))
                and not rows_cut(facts, call, loop.body)
            )
            if duplicates:  # an unpadded generation output alone is LD410's (all-gather-uneven-shapes)
                self._report(call, kind, unpadded, None if prepared is not None else loop)

    def _accelerator(self, receiver: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """An ``Accelerator`` (``PartialState`` has no ``gather_for_metrics``)."""
        facts = self.facts
        if facts.is_accelerator(receiver, at):
            return True
        name = (get_full_name_for_node(receiver) or "").rsplit(".", 1)[-1].lower()
        return "accelerator" in name and facts.imports("accelerate")

    def _eval_loop(self, call: cst.Call):
        """The innermost ``for`` around ``call`` (same function) over a loader prepared by accelerate, when it
        evaluates; with the prepare origin of the loader."""
        facts = self.facts
        loops = {id(loop): expr for loop, expr in facts.data_loops()}
        for ancestor in facts.ancestors(call):
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                return None
            if (
                not isinstance(ancestor, cst.For)
                or id(ancestor) not in loops
                or not facts.is_within(call, ancestor.body)
            ):
                continue
            loader = loops[id(ancestor)]
            prepared = prepared_origin(facts, loader, ancestor)
            if prepared is None and not facts.unbound(loader, ancestor):
                continue
            if facts.trains(ancestor.body) or not self._evaluates(ancestor, loader, call):
                return None
            return ancestor, prepared  # no origin: a snippet's loader that nothing in sight binds
        return None

    def _evaluates(self, loop: cst.For, loader: cst.BaseExpression, call: cst.Call) -> bool:
        name = (get_full_name_for_node(loader) or "").rsplit(".", 1)[-1].lower()
        return (
            self.facts.under_no_grad(call)
            or any(word in name for word in EVALUATION_LOADER_WORDS)
            or evaluation_function(self.facts, loop)
            or eval_mode_set(self.facts, loop, before=True)
        )

    # -- the report ---------------------------------------------------------------------------

    def _report(self, call: cst.Call, kind: str, unpadded: bool, unknown: cst.For | None = None) -> None:
        receiver = get_full_name_for_node(call.func.value) or "accelerator"
        message = (
            f"`{receiver}.gather` in an evaluation loop over a prepared loader keeps the samples that accelerate "
            "repeats to fill the last batch, so the metric counts them twice; "
        )
        if unknown is not None:  # a snippet: nothing in sight says whether the loader was prepared
            loader = self.context.module.code_for_node(iterated_expression(unknown.iter) or unknown.iter)
            message = (
                f"`{receiver}.gather` in an evaluation loop over `{loader}`: if `{loader}` is prepared by accelerate "
                "(nothing in sight binds it), the samples that accelerate repeats to fill the last batch are kept, "
                "and the metric counts them twice; "
            )
        fix = None
        if kind == "reshaped":
            message += (
                f"gather the per-sample tensor with `{receiver}.gather_for_metrics` before reshaping it (its first "
                "dimension is no longer the sample here, so the truncation would cut the wrong rows)"
            )
        else:
            message += f"use `{receiver}.gather_for_metrics`"
            new = call.with_changes(func=call.func.with_changes(attr=cst.Name("gather_for_metrics")))
            fix = Fix(Applicability.SAFE, "Use `gather_for_metrics`", replacements=((call, new),))
        if unpadded:
            message += (
                " (and pad the generated ids first with `pad_across_processes`: their length differs between ranks)"
            )
        self.report(call, message, fix=fix, severity=Severity.INFO if unknown is not None else None)
