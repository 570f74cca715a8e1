"""Whether a loop evaluates rather than trains."""

from __future__ import annotations

from lintdist.facts import Loop, PythonFacts
from lintdist.loaders import eval_mode_set, evaluation_function


def evaluates(facts: PythonFacts, loop: Loop) -> bool:
    """The loop evaluates: it runs under ``no_grad``/``inference_mode``, or, running no backward, after
    ``model.eval()`` (in its function, or the module for a module-level loop) or in a function named for evaluation.
    A pass with no backward that is none of these (mining, statistics, a custom update) is not evaluation."""
    if facts.under_no_grad(loop):
        return True
    if facts.trains(loop.body):
        return False
    return evaluation_function(facts, loop) or eval_mode_set(facts, loop)
