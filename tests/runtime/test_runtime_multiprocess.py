"""Real multi-process proof on CPU/gloo: one spawned process group per world size runs every check once."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import pytest
from runtime_harness import Job, draw_examples, run_world, token_loss_cases

from lintdist.runtime import selftest

pytestmark = pytest.mark.slow

SETUPS = ("ddp", "accelerate", "fsdp1", "fsdp2")
DRAWN_CASES = 10
TOLERANCE = 1e-9
TOKEN_WINDOWS = {
    "accelerate": {"setup": "accelerate"},
    "accelerate-sum-unshifted": {"setup": "accelerate", "reduction": "sum", "shifted": False},
    "accelerate-iterable": {"setup": "accelerate", "iterable": True},
    "ddp": {"setup": "ddp"},
    "ddp-loss-over-steps": {"setup": "ddp", "grad_divisor": 3},
}


@dataclass(frozen=True)
class WorldRun:
    world_size: int
    cases: dict[str, selftest.TokenLossCase]
    verdicts: dict[str, list[selftest.Verdict]]

    def token_loss(self, recipe: str = "correct") -> dict[str, tuple[selftest.TokenLossCase, list[selftest.Verdict]]]:
        return {name: (case, self.verdicts[name]) for name, case in self.cases.items() if case.recipe == recipe}


def _plan(world_size: int) -> tuple[dict[str, selftest.TokenLossCase], dict[str, Job]]:
    lengths = selftest.canonical_lengths(world_size)
    cases = {
        f"grid-{setup}-G{accumulation}-{reduction}-{'shifted' if shifted else 'unshifted'}": selftest.TokenLossCase(
            setup, accumulation, lengths, reduction, shifted
        )
        for setup in SETUPS
        for accumulation in (1, 3)
        for reduction in ("sum", "mean")
        for shifted in (False, True)
    }
    cases |= {
        f"wrong-{setup}-{recipe}": selftest.TokenLossCase(setup, 3, lengths, recipe=recipe)
        for setup in SETUPS
        for recipe in selftest.WRONG_RECIPES
    }
    drawn = draw_examples(token_loss_cases(world_size, SETUPS), DRAWN_CASES)
    cases |= {f"drawn-{index}": case for index, case in enumerate(drawn)}
    cases["bf16-autocast"] = selftest.TokenLossCase("ddp", 3, lengths, "mean", shifted=True, autocast=True)
    jobs: dict[str, Job] = {name: (selftest.check_token_loss, {"case": case}) for name, case in cases.items()}
    jobs |= {f"grad-sync-{setup}": (selftest.check_grad_sync, {"setup": setup}) for setup in SETUPS}
    jobs["set-epoch"] = (selftest.check_set_epoch, {})
    jobs |= {
        f"main-first-{flavour}": (selftest.check_main_process_first, {"accelerate": accelerate, "local": local})
        for flavour, accelerate, local in (
            ("raw", False, False),
            ("raw-local", False, True),
            ("accelerate", True, False),
            ("accelerate-local", True, True),
        )
    }
    jobs["any-rank-raw"] = (selftest.check_any_rank, {})
    jobs["any-rank-accelerate"] = (selftest.check_any_rank, {"accelerate": True})
    jobs["scheduler"] = (selftest.check_scheduler_total_steps, {})
    jobs["watch-channel"] = (selftest.check_watch_channel, {})
    jobs |= {
        f"token-windows-{name}": (selftest.check_token_windows, options) for name, options in TOKEN_WINDOWS.items()
    }
    return cases, jobs


@pytest.fixture(scope="module", params=(1, 2, 3, 4), ids=lambda world_size: f"W={world_size}")
def world(request: pytest.FixtureRequest) -> WorldRun:
    cases, jobs = _plan(request.param)
    return WorldRun(request.param, cases, run_world(request.param, jobs))


def _all_pass(verdicts: list[selftest.Verdict]) -> bool:
    return all(verdict.status == "PASS" for verdict in verdicts)


def test_token_loss_gradient_equals_global_token_mean(world: WorldRun) -> None:
    runs = {name: run for name, run in world.token_loss().items() if not run[0].autocast}
    assert len(runs) > len(SETUPS) * 8
    for name, (case, verdicts) in runs.items():
        for verdict in verdicts:
            assert verdict.status == "PASS", f"{name}: {verdict.line()}\n{case}"
            assert verdict.metrics["max_error"] <= TOLERANCE, name
            # The logged loss (scaled losses summed over the window and ranks, over G_div * W) is the global mean.
            assert verdict.metrics["loss_error"] <= TOLERANCE, name
    covered = {(case.setup, case.accumulation, case.reduction, case.shifted) for case, _ in runs.values()}
    assert len(covered) == len(SETUPS) * 2 * 2 * 2


def test_accelerate_runs_in_its_multi_cpu_mode(world: WorldRun) -> None:
    setups = {
        verdict.setup
        for case, verdicts in world.token_loss().values()
        for verdict in verdicts
        if case.setup == "accelerate"
    }
    assert setups and all(setup.startswith("accelerate MULTI_CPU") for setup in setups), setups


def test_wrong_recipes_miss_the_reference(world: WorldRun) -> None:
    for setup in SETUPS:
        case = dataclasses.replace(world.cases[f"wrong-{setup}-local-count"], recipe="correct")
        expected = selftest.wrong_recipes_expected_to_differ(case)
        assert "mean-per-micro-batch" in expected
        assert ("no-world-factor" in expected) == (world.world_size > 1)
        assert ("local-count" in expected) == (world.world_size > 1)
        for recipe in selftest.WRONG_RECIPES:
            verdict = world.verdicts[f"wrong-{setup}-{recipe}"][0]
            if recipe in expected:
                assert verdict.metrics["max_error"] > 1e3 * selftest.MISMATCH_THRESHOLD, verdict.line()
            else:
                assert verdict.metrics["max_error"] <= TOLERANCE, verdict.line()
        # Without the W factor the first step's gradient is exactly the reference divided by W.
        no_factor = world.verdicts[f"wrong-{setup}-no-world-factor"][0]
        assert no_factor.metrics["first_window_norm_ratio"] == pytest.approx(1 / world.world_size, abs=1e-9)


def test_bf16_autocast_scale_mean_stays_close_and_finite(world: WorldRun) -> None:
    for verdict in world.verdicts["bf16-autocast"]:
        assert verdict.status == "PASS", verdict.line()
        assert math.isfinite(verdict.metrics["max_error"])
        assert verdict.metrics["max_error"] <= verdict.metrics["tolerance"]


def test_grad_sync_skips_communication_until_the_last_micro_batch(world: WorldRun) -> None:
    for setup in ("ddp", "accelerate"):
        for verdict in world.verdicts[f"grad-sync-{setup}"]:
            assert verdict.status == "PASS", verdict.line()
            metrics = verdict.metrics
            distributed = setup == "ddp" or world.world_size > 1
            assert metrics["calls_without_grad_sync"] == 3 * metrics["buckets"]
            assert metrics["calls_per_window"] == (metrics["buckets"] if distributed else 3 * metrics["buckets"])
            assert metrics["calls_before_last"] == (0 if distributed else 2 * metrics["buckets"])
            assert (metrics["ranks_differ_before_last"] > 0) == (world.world_size > 1)
            assert metrics["ranks_differ_after_last"] == 0
    for verdict in world.verdicts["grad-sync-fsdp1"]:
        assert verdict.status == "PASS", verdict.line()
        assert (verdict.metrics["ranks_differ_before_last"] > 0) == (world.world_size > 1)
        assert verdict.metrics["ranks_differ_after_last"] == 0
    for verdict in world.verdicts["grad-sync-fsdp2"]:
        assert verdict.status == "PASS", verdict.line()
        assert verdict.metrics["reduced_before_last"] == 0 and verdict.metrics["reduced_after_last"] == 1


def test_set_epoch_gives_new_disjoint_permutations(world: WorldRun) -> None:
    assert _all_pass(world.verdicts["set-epoch"]), world.verdicts["set-epoch"][0].line()


@pytest.mark.parametrize("flavour", ["raw", "raw-local", "accelerate", "accelerate-local"])
def test_main_process_first_orders_and_survives_an_exception(world: WorldRun, flavour: str) -> None:
    verdicts = world.verdicts[f"main-first-{flavour}"]
    assert _all_pass(verdicts), [verdict.line() for verdict in verdicts]


@pytest.mark.parametrize("flavour", ["raw", "accelerate"])
def test_any_rank_stops_every_rank_at_the_same_step(world: WorldRun, flavour: str) -> None:
    verdicts = world.verdicts[f"any-rank-{flavour}"]
    assert _all_pass(verdicts), [verdict.line() for verdict in verdicts]


def test_scheduler_total_steps_ends_the_schedule_at_the_last_optimizer_step(world: WorldRun) -> None:
    for verdict in world.verdicts["scheduler"]:
        assert verdict.status == "PASS", verdict.line()
        assert verdict.metrics["end"] == 4
        # What the helper fixes: a schedule built for K optimizer steps ends after K / W of them.
        assert verdict.metrics["naive_end"] == math.ceil(4 / world.world_size)


@pytest.mark.parametrize("name", list(TOKEN_WINDOWS))
def test_token_windows_steps_follow_the_global_token_mean_where_the_loop_steps(world: WorldRun, name: str) -> None:
    # 2 epochs of 7 micro-batches per rank, G=3: windows 3, 3, 1 per epoch. Resumed after 2 batches: 3, 2 in the
    # first epoch from accelerator.step 0; 1, 3, 1 from accelerator.step 2 (a checkpoint saved mid-window).
    for verdict in world.verdicts[f"token-windows-{name}"]:
        assert verdict.status == "PASS", verdict.line()
        metrics = verdict.metrics
        assert metrics["max_error"] <= TOLERANCE, verdict.line()
        assert metrics["steps"] == metrics["steps_without_wrapper"] == metrics["compared_steps"] == 6
        assert metrics["pattern_matches"] == 1
        if name.startswith("accelerate"):
            loader = ", DataLoaderDispatcher" if name.endswith("iterable") else ""
            assert verdict.setup == f"accelerate MULTI_CPU, W={world.world_size}, G=3{loader}"
            for prefix, steps in (("resume_", 5), ("resume_mid_window_", 6)):
                assert metrics[f"{prefix}max_error"] <= TOLERANCE, verdict.line()
                assert metrics[f"{prefix}steps"] == metrics[f"{prefix}steps_without_wrapper"] == steps
                assert metrics[f"{prefix}compared_steps"] == steps and metrics[f"{prefix}pattern_matches"] == 1
        else:
            assert verdict.setup == f"raw DDP, W={world.world_size}, G=3"


def test_watch_side_channel_reaches_every_rank_and_adds_no_collective(world: WorldRun) -> None:
    verdicts = world.verdicts["watch-channel"]
    assert _all_pass(verdicts), verdicts[0].line()
    for verdict in verdicts:
        assert verdict.metrics == {"ranks_seen": world.world_size, "claims": 1.0, "collectives_unchanged": 1.0}
