"""lintdist/seeds.py: how a script seeds and draws from the global random generators."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.seeds import first_draws, per_rank_seed, seed_value, seeded_generator, worker_init
from lintdist.syntax import SyntaxIndex


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


def test_generators_seeded_with_a_value():
    facts = _facts(
        """
        import random
        import numpy as np
        import torch
        from torch import manual_seed
        random.seed(1)
        np.random.seed(1)
        torch.manual_seed(1)
        torch.cuda.manual_seed_all(1)
        manual_seed(1)
        random.seed(None)
        random.seed()
        rng.seed(1)
        """
    )
    found = [seeded_generator(facts, call) for call in facts.calls]
    assert found == ["random", "numpy", "torch", "cuda", "torch", None, None, None]
    assert seed_value(facts.calls[5]) is None


def test_first_draws_skip_local_generators_and_state():
    facts = _facts(
        """
        import random
        import numpy as np
        import torch
        rng = np.random.default_rng(0)
        state = random.getstate()
        x = random.random()
        y = random.choice(items)
        z = torch.randn(3)
        """
    )
    draws = first_draws(facts, {"random", "numpy", "torch"})
    assert sorted(draws) == ["random", "torch"]
    assert facts.index.module.code_for_node(draws["random"]) == "random.random()"
    assert first_draws(facts, {"numpy"}) == {}


def test_per_rank_seed_and_worker_init():
    facts = _facts(
        """
        import torch
        from accelerate import Accelerator
        accelerator = Accelerator()
        a = 42 + accelerator.process_index
        b = accelerator.process_index + seed
        c = 42 + rank

        def seed_worker(worker_id):
            torch.manual_seed(worker_id)

        def init(worker_id):
            torch.manual_seed(worker_id)

        def other():
            torch.manual_seed(0)

        loader = DataLoader(ds, worker_init_fn=init)
        """
    )
    values = [s.value for s in facts.index.nodes(cst.Assign)][1:4]
    assert [facts.index.module.code_for_node(per_rank_seed(facts, v, v) or cst.Name("_")) for v in values] == [
        "42",
        "seed",
        "_",
    ]
    seeds = [call for call in facts.calls if facts.method_name(call) == "manual_seed"]
    assert [worker_init(facts, call) for call in seeds] == [True, True, False]
