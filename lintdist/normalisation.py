"""How a loss is normalised: a per-micro-batch mean or a sum, the token count it is divided by, and the
world-size and accumulation factors it is scaled by (read from ``lintdist.loop``'s loss chains)."""

from __future__ import annotations

from dataclasses import dataclass

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
