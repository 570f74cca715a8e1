"""Whether a loop evaluates rather than trains."""

from __future__ import annotations

from lintdist.facts import Loop, PythonFacts

# A function whose name says it evaluates (`evaluate`, `validate`, `run_test`, `predict`...).
EVALUATION_WORDS = ("eval", "valid", "test", "predict", "infer")


def evaluates(facts: PythonFacts, loop: Loop) -> bool:
    """The loop evaluates: it runs under ``no_grad``/``inference_mode``, or, running no backward, after
    ``model.eval()`` (in its function, or the module for a module-level loop) or in a function named for evaluation.
    A pass with no backward that is none of these (mining, statistics, a custom update) is not evaluation."""
    if facts.under_no_grad(loop):
        return True
    if facts.trains(loop.body):
        return False
    function = facts.enclosing_function(loop)
    name = function.name.value.lower() if function is not None else ""
    if any(word in name for word in EVALUATION_WORDS):
        return True
    scope = function if function is not None else facts.index.module
    return any(facts.method_name(call) == "eval" and not call.args for call in facts.calls_within(scope))
