"""LD404 gather-for-metrics: `accelerator.gather` of per-sample eval results keeps the last batch's duplicates."""

from __future__ import annotations

import re

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import argument_of
from lintdist.launch import switched_on
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Pattern, Rule, Valid

# A function whose name says it evaluates, and loader names that say they hold evaluation data.
EVALUATION_WORDS = ("eval", "valid", "test", "predict", "infer")
EVALUATION_LOADER_WORDS = ("eval", "val", "test", "dev", "predict")
# Reductions that leave a 0-d tensor when called with no dimension.
REDUCTIONS = frozenset({"mean", "sum", "item", "max", "min", "norm", "std", "var", "numel", "prod", "all", "any"})
# Calls that make a per-batch scalar per-sample by copying it (`loss.repeat(bs)`): not a per-sample tensor.
COPIES = frozenset({"repeat", "expand", "repeat_interleave", "expand_as"})
# Calls and operations that mix the batch dimension with others: truncating the first dimension to the
# number of real samples would then cut the wrong elements.
RESHAPES = frozenset({"view", "reshape", "flatten", "ravel", "transpose", "permute", "t", "masked_select", "nonzero"})
# Loss functions (`F.cross_entropy`, `criterion`, `loss_fn`): a mean over the batch unless `reduction="none"`.
LOSS_WORDS = ("loss", "criterion", "entropy", "mse", "nll", "l1", "kl_div")
SCALAR_FACTORIES = frozenset({"torch.tensor", "torch.as_tensor", "torch.scalar_tensor"})
PREPARE_METHODS = frozenset({"prepare", "prepare_data_loader"})


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
    `pad_across_processes` (by `gather` or `gather_for_metrics`) is reported
    at info: its length differs between ranks, and the gather fails.

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
            derived = self._derived(loop)
            value = call.args[0].value
            if not self._mentions(value, derived):
                continue
            kind = self._per_sample(value, loop, derived, call)
            if kind is None:
                continue
            unpadded = self._unpadded_generation(value, loop)
            duplicates = (
                func.attr.value == "gather"
                and not self._padding_off()
                and not self._drop_last(prepared)
                and not self._truncated(call, loop)
            )
            if duplicates:
                self._report(call, kind, unpadded)
            elif unpadded:
                self.report(
                    call,
                    "the generated ids have a different length on each rank; pad them first with "
                    "`accelerator.pad_across_processes(x, dim=1, pad_index=...)` before gathering",
                    severity=Severity.INFO,
                )

    # -- what is gathered, by what, where ------------------------------------------------------

    def _accelerator(self, receiver: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """An ``Accelerator`` (``PartialState`` has no ``gather_for_metrics``)."""
        facts = self.facts
        if facts.is_accelerator(receiver, at):
            return True
        name = (get_full_name_for_node(receiver) or "").rsplit(".", 1)[-1].lower()
        return "accelerator" in name and facts.imports("accelerate")

    def _eval_loop(self, call: cst.Call) -> tuple[cst.For, cst.CSTNode] | None:
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
            prepared = self._prepared(loader, ancestor)
            if prepared is None:
                continue
            if facts.trains(ancestor.body) or not self._evaluates(ancestor, loader, call):
                return None
            return ancestor, prepared
        return None

    def _prepared(self, loader: cst.BaseExpression, loop: cst.For) -> cst.CSTNode | None:
        facts = self.facts
        for origin in facts.origins(loader, loop):
            node = origin.node
            if (
                isinstance(node, cst.Call)
                and facts.is_prepare_call(node)
                and facts.method_name(node) in PREPARE_METHODS
            ):
                return _PreparedAt(node, origin.index)
        return None

    def _evaluates(self, loop: cst.For, loader: cst.BaseExpression, call: cst.Call) -> bool:
        facts = self.facts
        if facts.under_no_grad(call):
            return True
        name = (get_full_name_for_node(loader) or "").rsplit(".", 1)[-1].lower()
        if any(word in name for word in EVALUATION_LOADER_WORDS):
            return True
        function = facts.enclosing_function(loop)
        if function is not None and any(word in function.name.value.lower() for word in EVALUATION_WORDS):
            return True
        scope = function if function is not None else self.context.module
        return any(
            facts.method_name(c) == "eval" and not c.args and facts.index.order(c) < facts.index.order(loop)
            for c in facts.calls_within(scope)
        )

    def _derived(self, loop: cst.For) -> set[str]:
        """Names that hold the batch or something computed from it inside the loop (model outputs...)."""
        facts = self.facts
        derived = {n.value for n in facts.within(loop.target, cst.Name)}
        for statement in facts.within(loop.body, cst.Assign, cst.AnnAssign, cst.AugAssign):
            value = statement.value
            if value is None or not self._mentions(value, derived):
                continue
            targets = [t.target for t in statement.targets] if isinstance(statement, cst.Assign) else [statement.target]
            for target in targets:
                for name in facts.within(target, cst.Name, cst.Attribute):
                    key = get_full_name_for_node(name)
                    if key:
                        derived.add(key)
        return derived

    def _mentions(self, expr: cst.CSTNode, names: set[str]) -> bool:
        return any(get_full_name_for_node(n) in names for n in self.facts.within(expr, cst.Name, cst.Attribute))

    def _per_sample(
        self, value: cst.BaseExpression, loop: cst.For, derived: set[str], at: cst.CSTNode, depth: int = 0
    ) -> str | None:
        """ "plain" when ``value`` keeps one row per sample, "reshaped" when a reshape in the loop mixed the
        batch dimension; None for a 0-d value, a copied scalar (``loss.repeat(bs)``) or what cannot be told."""
        if depth > 4:
            return None
        if isinstance(value, (cst.Tuple, cst.List)):
            kinds = [self._per_sample(e.value, loop, derived, at, depth + 1) for e in value.elements]
            if not kinds or None in kinds:
                return None
            return "reshaped" if "reshaped" in kinds else "plain"
        if isinstance(value, cst.Dict):
            kinds = [
                self._per_sample(e.value, loop, derived, at, depth + 1)
                for e in value.elements
                if isinstance(e, cst.DictElement)
            ]
            if not kinds or None in kinds:
                return None
            return "reshaped" if "reshaped" in kinds else "plain"
        if self._scalar(value):
            return None
        reshaped = False
        node: cst.BaseExpression = value
        # walk down the method chain: `logits.argmax(-1).view(-1)`, `outputs.logits[:, 0]`
        while True:
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
                method = node.func.attr.value
                if method == "pad_across_processes" and node.args:
                    node = node.args[0].value
                    continue
                if not self._mentions(node.func.value, derived):
                    break  # `torch.argmax(x)`, `F.cross_entropy(...)`: a function, not a method of the value
                if method in COPIES:
                    return None
                if method in RESHAPES:
                    reshaped = True
                node = node.func.value
            elif isinstance(node, cst.Subscript):
                if _mask_or_reorder(node):
                    reshaped = True
                node = node.value
            elif isinstance(node, cst.Attribute) and node.attr.value == "loss":
                return None
            else:
                break
        if isinstance(node, cst.Name) and node.value not in {n.value for n in self.facts.within(loop.target, cst.Name)}:
            if "loss" in node.value.lower():
                return None  # a loss is a mean over the batch unless it was copied per sample
            binding = self._binding_in_loop(node, loop, at)
            if binding is not None:
                inner = self._per_sample(binding.value, loop, derived, binding.statement, depth + 1)
                if inner is None:
                    return None
                reshaped = reshaped or inner == "reshaped"
        elif isinstance(node, cst.Call):
            callee = (get_full_name_for_node(node.func) or "").rsplit(".", 1)[-1].lower()
            reduction = argument_of(node, "reduction", None)
            per_sample_loss = isinstance(reduction, cst.SimpleString) and reduction.evaluated_value == "none"
            if any(word in callee for word in LOSS_WORDS) and not per_sample_loss:
                return None  # a loss function's mean over the batch
            if not self._mentions(node, derived):
                return None  # a value not made from the batch: keep silent
        return "reshaped" if reshaped else "plain"

    def _scalar(self, value: cst.BaseExpression) -> bool:
        facts = self.facts
        if isinstance(value, cst.Call):
            if isinstance(value.func, cst.Attribute) and value.func.attr.value in REDUCTIONS:
                dims = [a for a in value.args if a.keyword is None or a.keyword.value in {"dim", "axis"}]
                return not dims
            if facts.qualified_names(value.func) & SCALAR_FACTORIES:
                return bool(value.args) and not isinstance(value.args[0].value, (cst.List, cst.Tuple, cst.ListComp))
        return isinstance(value, (cst.Integer, cst.Float))

    def _binding_in_loop(self, name: cst.Name, loop: cst.For, before: cst.CSTNode):
        """The last assignment (a ``Binding``) of ``name`` in the loop body before ``before``."""
        facts = self.facts
        found = None
        for binding in facts.bindings(name.value, before):
            if (
                binding.index is None
                and facts.is_within(binding.statement, loop.body)
                and facts.index.order(binding.statement) < facts.index.order(before)
            ):
                found = binding
        return found

    def _unpadded_generation(self, value: cst.BaseExpression, loop: cst.For) -> bool:
        node = value
        while (
            isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value != "generate"
        ):
            node = node.func.value
        if isinstance(node, cst.Name):
            binding = self._binding_in_loop(node, loop, value)
            node = binding.value if binding is not None else node
        return isinstance(node, cst.Call) and self.facts.method_name(node) == "generate"

    # -- what already removes the duplicates -----------------------------------------------------

    def _padding_off(self) -> bool:
        """``DataLoaderConfiguration(even_batches=False)`` or ``accelerator.even_batches = False``: no duplicates.
        An unknown value counts as off (nothing is reported). Asked only once a candidate gather is found."""
        if "ld404 padding off" not in self.facts._memo:
            self.facts._memo["ld404 padding off"] = self._find_padding_off()
        return self.facts._memo["ld404 padding off"]

    def _find_padding_off(self) -> bool:
        setting = self.settings.get("even_batches")
        if setting is not None and not switched_on(setting):
            return True
        for statement in self.facts.index.nodes(cst.Assign):
            for target in statement.targets:
                if isinstance(target.target, cst.Attribute) and target.target.attr.value == "even_batches":
                    value = statement.value
                    if not (isinstance(value, cst.Name) and value.value == "True"):
                        return True
        for call in self.facts.calls:
            if self.facts.method_name(call) == "join_uneven_inputs":
                even = argument_of(call, "even_batches", 1)
                if even is not None and not (isinstance(even, cst.Name) and even.value == "True"):
                    return True
        return False

    def _drop_last(self, prepared: _PreparedAt) -> bool:
        """The loader handed to ``prepare`` was built with ``drop_last=True``: the last batch is dropped, so
        there are no duplicates (and no remainder for ``gather_for_metrics`` to cut)."""
        facts = self.facts
        call = prepared.call
        args = [a for a in call.args if a.keyword is None and not a.star]
        if prepared.index is not None and prepared.index < len(args):
            given = args[prepared.index].value
        elif prepared.index is None and len(args) == 1:
            given = args[0].value
        else:
            return False
        for origin in facts.origins(given, call):
            node = origin.node
            if isinstance(node, cst.Call):
                drop = argument_of(node, "drop_last", 7 if get_full_name_for_node(node.func) == "DataLoader" else None)
                if isinstance(drop, cst.Name) and drop.value == "True":
                    return True
        return False

    def _truncated(self, call: cst.Call, loop: cst.For) -> bool:
        """The gathered rows are cut in the loop (``preds[: len(dataset) - seen]``), or a ``samples_seen``-like
        counter follows the dataset's length there."""
        facts = self.facts
        names: set[str] = set()
        parent = facts.parent(call)
        if isinstance(parent, cst.Subscript) and _first_slice_bounded(parent):
            return True
        statement = next((a for a in facts.ancestors(call) if isinstance(a, (cst.Assign, cst.AnnAssign))), None)
        if statement is not None:
            targets = [t.target for t in statement.targets] if isinstance(statement, cst.Assign) else [statement.target]
            for target in targets:
                names |= {n.value for n in facts.within(target, cst.Name)}
        for subscript in facts.within(loop.body, cst.Subscript):
            if (
                isinstance(subscript.value, cst.Name)
                and subscript.value.value in names
                and _first_slice_bounded(subscript)
                and facts.index.order(subscript) > facts.index.order(call)
            ):
                return True
        return False

    # -- the report ---------------------------------------------------------------------------

    def _report(self, call: cst.Call, kind: str, unpadded: bool) -> None:
        receiver = get_full_name_for_node(call.func.value) or "accelerator"
        message = (
            f"`{receiver}.gather` in an evaluation loop over a prepared loader keeps the samples that accelerate "
            "repeats to fill the last batch, so the metric counts them twice; "
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
        self.report(call, message, fix=fix)


class _PreparedAt:
    """A ``prepare`` call and which of its results the loader is (None: the whole result)."""

    __slots__ = ("call", "index")

    def __init__(self, call: cst.Call, index: int | None) -> None:
        self.call = call
        self.index = index


def _first_slice_bounded(subscript: cst.Subscript) -> bool:
    """``x[:n]``, ``x[:n, ...]``: the first dimension is cut at an upper bound."""
    if not subscript.slice:
        return False
    first = subscript.slice[0].slice
    return isinstance(first, cst.Slice) and first.upper is not None and first.lower is None


def _mask_or_reorder(subscript: cst.Subscript) -> bool:
    """A boolean mask on the first dimension (``x[mask]``, ``x[labels != -100]``): rows no longer per sample."""
    if len(subscript.slice) != 1 or not isinstance(subscript.slice[0].slice, cst.Index):
        return False
    value = subscript.slice[0].slice.value
    if isinstance(value, (cst.Comparison, cst.UnaryOperation)):
        return True
    return "mask" in (get_full_name_for_node(value) or "").lower()
