"""lintdist/ordering.py: whether code runs on every rank at once, or one rank first, or on some ranks only."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.ordering import after_rank_barrier, goes_first, runs_ordered
from lintdist.syntax import SyntaxIndex


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


def _calls(facts: PythonFacts, text: str) -> list[cst.Call]:
    module = facts.index.module
    return [c for c in facts.calls if module.code_for_node(c.func) == text]


def test_main_process_first_contexts_are_recognised_by_name_binding_or_barrier():
    facts = _facts(
        """
        import torch.distributed as dist
        from contextlib import contextmanager

        @contextmanager
        def rank0_then_others(rank):
            if rank != 0:
                dist.barrier()
            yield

        first = accelerator.main_process_first
        with accelerator.main_process_first():
            pass
        with torch_distributed_zero_first(rank):
            pass
        with first():
            pass
        with rank0_then_others(rank):
            pass
        with open("f"):
            pass
        """
    )
    items = [w.items[0].item for w in facts.index.nodes(cst.With)]
    assert [goes_first(facts, item) for item in items] == [True, True, True, True, False]


def test_the_rank_zero_first_barrier_opens_an_ordered_stretch():
    facts = _facts(
        """
        import torch.distributed as dist
        prepare()
        if dist.get_rank() != 0:
            dist.barrier()
        download()
        if dist.get_rank() == 0:
            dist.barrier()
        """
    )
    module = facts.index.module
    _, before, _, after, _ = module.body
    assert not after_rank_barrier(facts, module, before)
    assert after_rank_barrier(facts, module, after)
    assert not runs_ordered(facts, _calls(facts, "prepare")[0])
    assert runs_ordered(facts, _calls(facts, "download")[0])


def test_guards_per_rank_loops_and_callers_order_code():
    facts = _facts(
        """
        def fetch():
            download()

        def everywhere():
            work()

        if accelerator.is_main_process:
            fetch()
        for url in urls[rank::world_size]:
            get(url)
        with accelerator.main_process_first():
            prepare()
        everywhere()
        late()
        """
    )
    assert runs_ordered(facts, _calls(facts, "download")[0])  # its only caller is under the main-process test
    assert runs_ordered(facts, _calls(facts, "get")[0])
    assert runs_ordered(facts, _calls(facts, "prepare")[0])
    assert not runs_ordered(facts, _calls(facts, "work")[0])
    assert not runs_ordered(facts, _calls(facts, "late")[0])
