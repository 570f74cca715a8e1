"""What a sampler is (lintdist/samplers.py)."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.samplers import (
    epoch_told_around,
    epoch_told_out_of_sight,
    is_set_epoch,
    keeps_order,
    may_tell_epoch_of,
    rank_aware,
    rank_aware_among,
    reseeded_each_pass,
    sampler_kinds,
    tells_epoch,
    torch_sampler,
    unshuffled_by_name,
    wrapper_tells_epoch,
)
from lintdist.syntax import SyntaxIndex


def _facts(source: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(source)))
    return PythonFacts(index, NameResolver(index))


def _call(facts: PythonFacts, name: str) -> cst.Call:
    return next(c for c in facts.calls if (cst.Module([]).code_for_node(c.func)).endswith(name))


def _keyword(facts: PythonFacts, keyword: str) -> cst.BaseExpression:
    return next(a.value for c in facts.calls for a in c.args if a.keyword is not None and a.keyword.value == keyword)


def test_rank_aware_samplers():
    facts = _facts(
        """
        from torch.utils.data import DistributedSampler
        a = DistributedSampler(ds)
        b = DistributedSampler(ds, num_replicas=1, rank=0)
        c = DistributedBucketSampler(ds)
        d = Bucketed(ds, num_replicas=world, rank=rank)
        e = Bucketed(ds, num_replicas=world)
        """
    )
    calls = {c.func.value: c for c in facts.calls}
    assert rank_aware(facts, calls["DistributedBucketSampler"])
    aware = [rank_aware(facts, c) for c in facts.calls]
    assert aware == [True, False, True, True, False]
    assert not rank_aware(facts, cst.Name("x"))


def test_keeps_order_sees_sequential_unshuffled_and_batched_samplers():
    facts = _facts(
        """
        from torch.utils.data import BatchSampler, DistributedSampler, SequentialSampler
        f(a=SequentialSampler(ds), b=DistributedSampler(ds, shuffle=False), c=DistributedSampler(ds),
          d=BatchSampler(SequentialSampler(ds), 8, False))
        """
    )
    at = facts.calls[0]
    assert keeps_order(facts, _keyword(facts, "a"), at)
    assert keeps_order(facts, _keyword(facts, "b"), at)
    assert not keeps_order(facts, _keyword(facts, "c"), at)
    assert keeps_order(facts, _keyword(facts, "d"), at, batched=True)
    assert not keeps_order(facts, _keyword(facts, "d"), at)


def test_unshuffled_by_name():
    facts = _facts(
        """
        from torch.utils.data import DistributedSampler
        a = OrderedDistributedSampler(ds)
        b = DistributedSampler(ds)
        c = SequentialDistributedSampler(ds)
        """
    )
    assert [unshuffled_by_name(facts, c) for c in facts.calls] == [True, False, True]


def test_sampler_kinds():
    facts = _facts(
        """
        from torch.utils.data import DistributedSampler
        def build(ds, sampler=None):
            return DataLoader(ds, sampler=sampler)
        def used(ds, sampler=None):
            return DataLoader(ds, sampler=sampler)
        used(ds)
        s = DistributedSampler(ds) if distributed else None
        DataLoader(ds, sampler=s)
        DataLoader(ds, sampler=make())
        """
    )
    loaders = [c for c in facts.calls if getattr(c.func, "value", "") == "DataLoader"]
    kinds = [sampler_kinds(facts, loader.args[1].value, loader) for loader in loaders]
    assert kinds == [{"maybe"}, {"none"}, {"sampler", "none"}, {"unknown"}]


def test_set_epoch_spellings_and_definitions_that_tell_the_epoch():
    facts = _facts(
        """
        sampler.set_epoch(epoch)
        getattr(sampler, "set_epoch", None)(epoch)
        getattr(sampler, "other")(epoch)
        class Endless:
            def restart(self):
                self.loader.sampler.epoch += 1
        def plain():
            pass
        """
    )
    assert [is_set_epoch(facts, c) for c in facts.calls] == [True, True, False, False, False]  # outer calls first
    (endless,) = facts.classes
    assert tells_epoch(facts, endless)
    assert not tells_epoch(facts, facts.functions["plain"][0])


def test_epoch_told_around_looks_at_outer_loops_and_helpers():
    facts = _facts(
        """
        def start(epoch):
            sampler.set_epoch(epoch)
        for epoch in range(3):
            start(epoch)
            for again in range(2):
                for batch in loader:
                    pass
        for epoch in range(3):
            for batch in loader:
                pass
        """
    )
    inner = next(loop for loop in facts.loops if cst.Module([]).code_for_node(loop.target) == "again")
    last = facts.loops[-2]
    assert epoch_told_around(facts, inner)
    assert not epoch_told_around(facts, last)
    assert not epoch_told_out_of_sight(facts, last)  # `start` has a call site


def test_epoch_told_out_of_sight_by_an_uncalled_hook():
    facts = _facts(
        """
        class Hook:
            def on_epoch_start(self, epoch):
                self.sampler.set_epoch(epoch)
        for epoch in range(3):
            for batch in loader:
                pass
        """
    )
    assert epoch_told_out_of_sight(facts, facts.loops[0])


def test_wrapper_tells_epoch():
    facts = _facts(
        """
        class Endless:
            def __iter__(self):
                self.loader.sampler.set_epoch(self.n)
        stream = Endless(loader)
        plain = Other(loader)
        for batch in stream:
            pass
        """
    )
    at = facts.loops[0]
    assert wrapper_tells_epoch(facts, cst.Name("stream"), at)
    assert not wrapper_tells_epoch(facts, cst.Name("plain"), at)


def test_reseeded_each_pass():
    facts = _facts(
        """
        from torch.utils.data import DistributedSampler
        for epoch in range(3):
            a = DistributedSampler(ds, seed=base + epoch)
            b = DistributedSampler(ds, seed=base)
            c = DistributedSampler(ds)
        """
    )
    loop = facts.loops[0]
    samplers = [c for c in facts.calls if getattr(c.func, "value", "") == "DistributedSampler"]
    assert [reseeded_each_pass(facts, s, loop, "epoch") for s in samplers] == [True, False, False]


def test_may_tell_epoch_of_a_loader_through_its_sampler_or_an_unknown_receiver():
    facts = _facts(
        """
        loader = DataLoader(ds, shuffle=True)
        other = DataLoader(ds2, sampler=DistributedSampler(ds2))
        loader.sampler.set_epoch(epoch)
        other.sampler.set_epoch(epoch)
        set_epoch(loader, epoch)
        make().sampler.set_epoch(epoch)
        loader.sampler.step(epoch)
        """
    )
    loader = next(c for c in facts.calls if c.args and cst.Module([]).code_for_node(c.args[0].value) == "ds")
    own, others, helper, unknown, step = [c for c in facts.calls if facts.method_name(c) in ("set_epoch", "step")]
    assert may_tell_epoch_of(facts, own, loader)
    assert may_tell_epoch_of(facts, helper, loader)
    assert may_tell_epoch_of(facts, unknown, loader)  # a value lintdist cannot place may be this loader
    assert not may_tell_epoch_of(facts, others, loader)  # another loader's sampler
    assert not may_tell_epoch_of(facts, step, loader)


def test_torch_sampler_is_a_sampler_class_of_torch_utils_data():
    facts = _facts(
        """
        from torch.utils.data import RandomSampler
        from torch.utils.data.distributed import DistributedSampler
        from mylib import FancySampler
        RandomSampler(ds)
        DistributedSampler(ds)
        FancySampler(ds)
        torch.utils.data.DataLoader(ds)
        """
    )
    random, distributed, fancy, loader = facts.calls
    assert torch_sampler(facts, random) and torch_sampler(facts, distributed)
    assert not torch_sampler(facts, fancy)  # another library's class
    assert not torch_sampler(facts, loader)  # not a sampler
    assert not torch_sampler(facts, random.args[0].value)  # not a call


def test_rank_aware_among_a_sampler_arguments_values_and_inside_batch_samplers():
    facts = _facts(
        """
        from torch.utils.data import BatchSampler, DistributedSampler, RandomSampler
        DistributedSampler(ds)
        RandomSampler(ds)
        BatchSampler(DistributedSampler(ds2), 8, False)
        """
    )
    distributed, random, batches, inner = facts.calls
    assert rank_aware_among(facts, [distributed, random]) == [distributed]
    assert rank_aware_among(facts, [batches]) == []  # a batch sampler given as `sampler=`
    assert rank_aware_among(facts, [batches, random], batched=True) == [inner]


def _padding(source: str) -> str | None:
    from lintdist.samplers import padding_sampler

    facts = _facts(source)
    loop = next(n for n in facts.index.nodes(cst.For))
    found = padding_sampler(facts, loop.iter, loop)
    return None if found is None else facts.index.module.code_for_node(found)


def test_padding_sampler_is_a_distributed_sampler_that_does_not_drop():
    head = "from torch.utils.data import DataLoader, DistributedSampler\n"
    padded = (
        head + "s = DistributedSampler(ds, shuffle=False)\nfor b in enumerate(DataLoader(ds, sampler=s)):\n    pass\n"
    )
    assert _padding(padded) == "DistributedSampler(ds, shuffle=False)"
    assert _padding(padded.replace("shuffle=False", "drop_last=True")) is None
    assert _padding(padded.replace("shuffle=False", "drop_last=False")) == "DistributedSampler(ds, drop_last=False)"
    assert _padding(head + "for b in DataLoader(ds, shuffle=False):\n    pass\n") is None
    prepared = head + "loader = accelerator.prepare(DataLoader(ds, sampler=DistributedSampler(ds)))\n"
    assert _padding(prepared + "for b in loader:\n    pass\n") is None
    unpadded = head + "from evalkit import UnpaddedDistributedSampler\n"
    assert _padding(unpadded + "for b in DataLoader(ds, sampler=UnpaddedDistributedSampler(ds)):\n    pass\n") is None


def test_helper_returns_padding_follows_a_sampler_helper_of_another_module(tmp_path):
    from lintdist.project import Project, ProjectView
    from lintdist.samplers import helper_returns_padding, padding_sampler

    (tmp_path / "helpers.py").write_text(
        textwrap.dedent(
            """
            from torch.utils.data import DistributedSampler, RandomSampler

            def make_sampler(ds):
                if world_size() == 1:
                    return RandomSampler(ds)
                return DistributedSampler(ds, shuffle=False)

            def dropping_sampler(ds):
                return DistributedSampler(ds, drop_last=True)

            def plain_sampler(ds):
                return RandomSampler(ds)
            """
        )
    )
    main = (
        "import helpers\nfrom torch.utils.data import DataLoader\n"
        "for b in DataLoader(ds, sampler=helpers.make_sampler(ds)):\n    pass\n"
    )
    (tmp_path / "train.py").write_text(main)
    facts = _facts(main)
    facts.project = ProjectView(Project(), tmp_path / "train.py")
    calls = {cst.Module([]).code_for_node(c): c for c in facts.calls}
    assert helper_returns_padding(facts, calls["helpers.make_sampler(ds)"])
    loop = next(iter(facts.index.nodes(cst.For)))
    assert padding_sampler(facts, loop.iter, loop) is calls["helpers.make_sampler(ds)"]
    for name in ("dropping_sampler", "plain_sampler"):
        other = _facts(main.replace("make_sampler", name))
        other.project = ProjectView(Project(), tmp_path / "train.py")
        call = next(c for c in other.calls if name in cst.Module([]).code_for_node(c))
        assert not helper_returns_padding(other, call)
    facts.project = None
    assert not helper_returns_padding(facts, calls["helpers.make_sampler(ds)"])
