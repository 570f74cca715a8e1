"""How a script seeds and draws from the global random generators: which generator a call seeds (``random``,
``numpy``, ``torch``, ``cuda``) and with what, where the file first draws from each, whether a seed adds the
process index, and whether a function is a DataLoader's ``worker_init_fn`` (which seeds its worker on purpose)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from lintdist.facts import argument_of

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts

# The global generators a call seeds, by callee. `torch.manual_seed` seeds CPU, CUDA (all devices), MPS, XPU, MTIA
# and registered custom devices (torch 2.13 `torch/random.py::_manual_seed_impl`), so the CUDA calls add nothing.
SEEDS = {
    "random.seed": "random",
    "numpy.random.seed": "numpy",
    "torch.manual_seed": "torch",
    "torch.random.manual_seed": "torch",
    "torch.cuda.manual_seed": "cuda",
    "torch.cuda.manual_seed_all": "cuda",
}
SEED_METHODS = frozenset({"seed", "manual_seed", "manual_seed_all"})
# Explicit draws from each global generator. Local generators (`random.Random`, `np.random.default_rng`,
# `RandomState`) and state functions are not draws.
NOT_DRAWS = frozenset(
    {"seed", "Random", "SystemRandom", "getstate", "setstate", "RandomState", "default_rng", "Generator"}
    | {"get_state", "set_state", "SeedSequence", "PCG64", "MT19937", "BitGenerator"}
)
TORCH_DRAWS = frozenset(
    f"torch.{name}"
    for name in ("rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "normal")
    + ("bernoulli", "multinomial", "poisson")
)
DRAW_MODULES = {"random": "random", "numpy.random": "numpy"}


def seed_value(call: cst.Call) -> cst.BaseExpression | None:
    """The seed a seeding call passes (its ``seed`` argument), None when absent or ``None``."""
    seed = argument_of(call, "seed", 0)
    if seed is None or (isinstance(seed, cst.Name) and seed.value == "None"):
        return None
    return seed


def seeded_generator(facts: PythonFacts, call: cst.Call) -> str | None:
    """The global generator ``call`` seeds with a value: "random" (``random.seed(n)``), "numpy"
    (``np.random.seed(n)``), "torch" (``torch.manual_seed(n)``) or "cuda" (``torch.cuda.manual_seed_all(n)``)."""
    func = call.func
    if isinstance(func, cst.Attribute):
        if func.attr.value not in SEED_METHODS:
            return None
    elif not (isinstance(func, cst.Name) and func.value in facts.imported_names):
        return None
    names = facts.qualified_names(func) & SEEDS.keys()
    if not names or not facts.callee_is(call, frozenset(SEEDS)) or seed_value(call) is None:
        return None
    return SEEDS[min(names)]


def first_draws(facts: PythonFacts, generators: set[str]) -> dict[str, cst.Call]:
    """The first call that draws from each of these global generators ("random", "numpy", "torch"):
    ``random.random()``, ``np.random.shuffle(x)``, ``torch.randn(3)``."""
    found: dict[str, cst.Call] = {}
    for call in facts.calls:
        func = call.func
        last = func.attr.value if isinstance(func, cst.Attribute) else getattr(func, "value", None)
        if last is None or last in NOT_DRAWS:
            continue
        for name in facts.qualified_names(func):
            module, _, attr = name.rpartition(".")
            kind = DRAW_MODULES.get(module)
            if kind is None and name in TORCH_DRAWS:
                kind = "torch"
            if kind in generators and kind not in found and attr not in NOT_DRAWS:
                found[kind] = call
    return found


def per_rank_seed(facts: PythonFacts, seed: cst.BaseExpression, at: cst.CSTNode) -> cst.BaseExpression | None:
    """``n`` of a seed ``n + accelerator.process_index`` (either order); None for any other seed."""
    if not isinstance(seed, cst.BinaryOperation) or not isinstance(seed.operator, cst.Add):
        return None
    for base, rank in ((seed.left, seed.right), (seed.right, seed.left)):
        if (
            isinstance(rank, cst.Attribute)
            and rank.attr.value == "process_index"
            and facts.accelerator_like(rank.value, at)
        ):
            return base
    return None


def worker_init(facts: PythonFacts, node: cst.CSTNode) -> bool:
    """Whether ``node`` is in a DataLoader worker's set-up: a function named for a worker, or one handed to a
    loader as ``worker_init_fn=``."""
    function = facts.enclosing_function(node)
    if function is None:
        return False
    name = function.name.value
    if "worker" in name.lower():
        return True
    for other in facts.calls:
        value = argument_of(other, "worker_init_fn", None)
        if isinstance(value, cst.Name) and value.value == name:
            return True
    return False
