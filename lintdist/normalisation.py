"""How a loss is normalised: a per-micro-batch mean or a sum, the token count it is divided by (and which labels
that count reads), the world-size and accumulation factors it is scaled by, and gradients scaled by a count
after the backward (read from ``lintdist.loop``'s loss chains)."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import PythonFacts
from lintdist.loop import Chain, Term, TrainingLoop


@dataclass(frozen=True)
class Normalisation:
    """What a loss ``base x product(num) / product(den)`` amounts to."""

    # "mean" or "sum" (or the chain's other bases); a mean times this rank's own token count is its sum
    base: str | None
    count: Term | None  # the first token count the loss is divided by
    counted: bool  # some factor, above or below, is a token count
    world: bool  # some factor above is the number of processes
    accumulation: int  # accumulation factors above minus those below
    divided_by_accumulation: bool  # some factor below is the accumulation steps
    literal: int | None  # the first literal factor above (a hard-coded accumulation count)


def normalisation(loop: TrainingLoop, chain: Chain) -> Normalisation:
    """How the loss ``chain`` is normalised, factor by factor."""
    above = [(t, loop.factor(t)) for t in chain.num]
    below = [(t, loop.factor(t)) for t in chain.den]
    counts_above = [f for _, f in above if f.kind == "count"]
    counts_below = [t for t, f in below if f.kind == "count"]
    folded = chain.base == "mean" and counts_above and not counts_above[0].gathered
    return Normalisation(
        base="sum" if folded else chain.base,
        count=counts_below[0] if counts_below else None,
        counted=bool(counts_above or counts_below),
        world=any(f.kind == "world" for _, f in above),
        accumulation=sum(f.kind == "accum" for _, f in above) - sum(f.kind == "accum" for _, f in below),
        divided_by_accumulation=any(f.kind == "accum" for _, f in below),
        literal=next((f.literal for _, f in above if f.literal is not None), None),
    )


def counted_labels(loop: TrainingLoop, count: Term) -> cst.BaseExpression | None:
    """The one labels expression a token count compares with the ignore index (``batch["labels"]``,
    ``labels``, ``self.labels``); None when it counts several, counts some other way, or reads other tensors."""
    sites = loop.count_sites(count)
    if not sites or len(sites) != 1:
        return None
    labels = sites[0]
    if isinstance(labels, cst.Subscript):
        key = labels.slice[0].slice if len(labels.slice) == 1 else None
        named = (
            isinstance(key, cst.Index)
            and isinstance(key.value, cst.SimpleString)
            and "labels" in (key.value.evaluated_value or "")
        )
    else:
        name = get_full_name_for_node(labels) if isinstance(labels, (cst.Name, cst.Attribute)) else None
        named = name is not None and "labels" in name.rsplit(".", 1)[-1]
    return labels if named and not labels.lpar else None


def predicted_positions(labels: cst.BaseExpression) -> cst.Subscript:
    """``labels[..., 1:]``: the labels a causal LM predicts, after its one-position shift."""
    return cst.Subscript(
        value=labels,
        slice=[
            cst.SubscriptElement(cst.Index(cst.Ellipsis())),
            cst.SubscriptElement(cst.Slice(lower=cst.Integer("1"), upper=None)),
        ],
    )


def gradient_scaling(loop: TrainingLoop, call: cst.Call) -> tuple[Term, Term] | None:
    """The first division by a token count that scales gradients after the backward ``call``, in its function
    (torchtune's ``scale_grads(model, world_size / num_tokens)``): (the numerator, the count); None if none."""
    facts = loop.facts
    function = facts.enclosing_function(call)
    for scale in facts.calls_within(function if function is not None else facts.index.module):
        if "scale_grad" not in (facts.method_name(scale) or ""):
            continue
        for arg in scale.args:
            value = arg.value
            if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Divide):
                count = Term(value.right, scale)
                if loop.factor(count).kind == "count":
                    return Term(value.left, scale), count
    return None


def on_one_path(facts: PythonFacts, term: Term, call: cst.Call) -> bool:
    """Whether the factor ``term`` of the loss that ``call`` backs up sits in an ``if`` that does not hold the
    call, in its function (``if optimizer_in_backward: loss = loss / num_tokens``): the other path skips it."""
    return any(
        isinstance(a, cst.If) and not facts.is_within(call, a)
        for a in facts.ancestors(term.at)
        if not isinstance(a, cst.FunctionDef)
    ) and facts.enclosing_function(term.at) is facts.enclosing_function(call)
