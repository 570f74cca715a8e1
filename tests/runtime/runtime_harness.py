"""Run lintdist.runtime.selftest checks in one spawned gloo process group per world size, with hard timeouts."""

from __future__ import annotations

import os
import pickle
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from lintdist.runtime import selftest

Job = tuple[Callable[..., selftest.Verdict], dict[str, Any]]

# Every process group gets this timeout, so a collective that one rank never reaches fails instead of hanging.
GROUP_TIMEOUT_S = 60.0
JOIN_TIMEOUT_S = 200.0


def _rank_main(rank: int, world_size: int, port: int, jobs: Mapping[str, Job], out_dir: str) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)
    ctx = selftest.init_distributed("gloo", timeout_s=GROUP_TIMEOUT_S)
    results = {name: check(ctx, **kwargs) for name, (check, kwargs) in jobs.items()}
    selftest.shutdown_distributed()
    Path(out_dir, f"{rank}.pickle").write_bytes(pickle.dumps(results))


def run_world(world_size: int, jobs: Mapping[str, Job]) -> dict[str, list[selftest.Verdict]]:
    """Run every job on `world_size` spawned ranks; returns each job's verdicts, one per rank."""
    with tempfile.TemporaryDirectory() as out_dir:
        context = mp.start_processes(
            _rank_main,
            args=(world_size, selftest.free_port(), dict(jobs), out_dir),
            nprocs=world_size,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                for process in context.processes:
                    process.kill()
                raise TimeoutError(f"{world_size} ranks did not finish in {JOIN_TIMEOUT_S:.0f} s")
        per_rank = [pickle.loads(Path(out_dir, f"{rank}.pickle").read_bytes()) for rank in range(world_size)]
    return {name: [results[name] for results in per_rank] for name in jobs}


@st.composite
def token_loss_cases(draw: st.DrawFn, world_size: int, setups: tuple[str, ...]) -> selftest.TokenLossCase:
    """A correct-recipe case: uneven windows, variable lengths, -100 padding and one fully padded micro-batch."""
    accumulation = draw(st.sampled_from((1, 3)))
    steps = draw(st.integers(1, 2 * accumulation + 1))
    micro_batch = st.lists(st.integers(0, 5), min_size=1, max_size=3).map(tuple)
    ranks = [draw(st.lists(micro_batch, min_size=steps, max_size=steps)) for _ in range(world_size)]
    padded_rank, padded_step = draw(st.integers(0, world_size - 1)), draw(st.integers(0, steps - 1))
    ranks[padded_rank][padded_step] = (0,) * len(ranks[padded_rank][padded_step])
    return selftest.TokenLossCase(
        setup=draw(st.sampled_from(setups)),
        accumulation=accumulation,
        lengths=tuple(tuple(rank) for rank in ranks),
        reduction=draw(st.sampled_from(("sum", "mean"))),
        shifted=draw(st.booleans()),
        extra_padding=draw(st.integers(0, 2)),
        seed=draw(st.integers(0, 2**16)),
    )


def draw_examples(strategy: st.SearchStrategy[Any], count: int) -> list[Any]:
    """`count` examples of `strategy`, drawn up front so that one process group can run them all."""
    examples: list[Any] = []

    @settings(max_examples=count, database=None, derandomize=True, deadline=None, phases=[Phase.generate])
    @given(strategy)
    def collect(example: Any) -> None:
        examples.append(example)

    collect()
    return examples
