"""What a count of steps counts, and the power of the number of processes it carries (lintdist/step_counts.py)."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.step_counts import UNKNOWN, Count, StepCounts, loader_length, loader_sharding, read_scaled, unscaled_count
from lintdist.syntax import SyntaxIndex


def _facts(source: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(source)))
    return PythonFacts(index, NameResolver(index))


def _counts(source: str, bounds: dict[str, str] | None = None) -> list[Count]:
    """What the argument of the source's ``use(...)`` call counts; ``bounds`` maps a name to a stand-in loop test."""
    facts = _facts(source)
    call = next(c for c in facts.calls if isinstance(c.func, cst.Name) and c.func.value == "use")
    marker = call.func
    counts = StepCounts(facts, lambda key: marker if key in (bounds or {}) else None)
    return counts.evaluate(call.args[0].value, call)


def test_the_length_of_a_prepared_loader_counts_optimizer_steps():
    (value,) = _counts(
        """
        from accelerate import Accelerator
        accelerator = Accelerator()
        model, loader = accelerator.prepare(model, loader)
        use(epochs * len(loader))
        """
    )
    assert value.optimizer_steps and value.world == 0
    assert value.why == "the length of the prepared loader `loader`"


def test_the_length_of_a_loader_before_prepare_counts_all_batches():
    (value,) = _counts(
        """
        from torch.utils.data import DataLoader
        loader = DataLoader(dataset, batch_size=8)
        steps = math.ceil(len(loader) / args.gradient_accumulation_steps) * epochs
        use(steps)
        """
    )
    assert value.count and value.world == 1 and not value.optimizer_steps


def test_a_distributed_sampler_shards_the_loader():
    facts = _facts(
        """
        from torch.utils.data import DataLoader, DistributedSampler, BatchSampler
        sharded = DataLoader(dataset, batch_sampler=BatchSampler(DistributedSampler(dataset), 8, False))
        plain = DataLoader(dataset, batch_size=8)
        """
    )
    calls = [c for c in facts.calls if facts.method_name(c) == "DataLoader"]
    assert [loader_sharding(facts, c) for c in calls] == ["sharded", "unsharded"]
    assert loader_sharding(facts, cst.Name("x")) == "unknown"


def test_a_factor_of_the_number_of_processes_scales_the_count():
    (value,) = _counts(
        """
        model, loader = accelerator.prepare(model, loader)
        use(len(loader) * accelerator.num_processes)
        """
    )
    assert value.world == 1 and not value.optimizer_steps
    (environ,) = _counts(
        """
        model, loader = accelerator.prepare(model, loader)
        use(len(loader) * int(os.environ["WORLD_SIZE"]))
        """
    )
    assert environ.world == 1
    (wrapped,) = _counts(
        """
        from lintdist.runtime import scheduler_total_steps
        model, loader = accelerator.prepare(model, loader)
        use(scheduler_total_steps(len(loader), accelerator))
        """
    )
    assert wrapped.world == 1


def test_a_budget_the_loop_stops_on_is_a_count_given_or_derived():
    values = _counts(
        """
        from torch.utils.data import DataLoader
        def main(args):
            loader = DataLoader(dataset, batch_size=8)
            if args.max_train_steps is None:
                args.max_train_steps = args.epochs * len(loader)
            use(args.max_train_steps)
        """,
        bounds={"args.max_train_steps": "loop"},
    )
    assert sorted((v.count, v.world, v.optimizer_steps) for v in values) == [(True, 0, True), (True, 1, False)]
    given = next(v for v in values if v.optimizer_steps)
    assert given.why == "`args.max_train_steps` bounds the training loop" and given.where is not None


def test_a_constant_that_bounds_nothing_is_neutral_and_calls_lintdist_cannot_read_are_unknown():
    (constant,) = _counts("steps = 1000\nuse(steps)\n")
    assert not constant.count and constant.world == 0
    assert _counts("use(compute_steps(loader))\n") == [UNKNOWN]


def test_a_parameter_counts_what_the_callers_pass():
    values = _counts(
        """
        def build(optimizer, total):
            use(total)

        model, loader = accelerator.prepare(model, loader)
        build(optimizer, len(loader) * accelerator.num_processes)
        build(optimizer, len(loader))
        """
    )
    assert sorted((v.count, v.world) for v in values) == [(True, 0), (True, 1)]


def test_loader_length_of_a_name_not_yet_assigned_here_is_unknown():
    facts = _facts(
        """
        def main():
            n = len(loader)
            loader = make()
        """
    )
    call = next(c for c in facts.calls if facts.method_name(c) == "len")
    assert loader_length(facts, call.args[0].value, call) == UNKNOWN


def test_read_scaled_through_the_runtime_helper_or_times_the_processes():
    facts = _facts(
        """
        from lintdist.runtime import scheduler_total_steps
        use(scheduler_total_steps(total, accelerator), total * accelerator.num_processes, total * 2, total)
        """
    )
    call = next(c for c in facts.calls if isinstance(c.func, cst.Name) and c.func.value == "use")
    counts = StepCounts(facts, lambda key: None)
    wrapped, times_world, doubled, bare = (
        next(n for n in facts.within(arg.value, cst.Name) if n.value == "total") for arg in call.args
    )
    assert read_scaled(counts, wrapped, call)
    assert read_scaled(counts, times_world, call)
    assert not read_scaled(counts, doubled, call)
    assert not read_scaled(counts, bare, call)


def test_unscaled_count_is_the_first_count_of_optimizer_steps_and_whether_another_way_is_not():
    steps = Count(count=True, why="bounds the loop")
    scaled = Count(count=True, world=1)
    assert unscaled_count([scaled, steps]) == (steps, True)
    assert unscaled_count([steps]) == (steps, False)
    assert unscaled_count([scaled, UNKNOWN]) == (None, False)
