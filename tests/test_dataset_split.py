"""Whether a dataset is split across ranks already (``lintdist.dataset_split``)."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.dataset_split import device_use, iterable_call, mentions_rank, split_by_rank
from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


def _loaded(code: str) -> bool:
    """``split_by_rank`` of the dataset given to the script's ``DataLoader``."""
    facts = _facts(code)
    loader = next(c for c in facts.calls if facts.index.module.code_for_node(c.func) == "DataLoader")
    return split_by_rank(facts, loader.args[0].value, loader)


def test_a_map_style_dataset_is_not_split():
    assert not _loaded(
        """
        from torch.utils.data import DataLoader, TensorDataset
        ds = TensorDataset(x.to(rank), y)
        DataLoader(ds, batch_size=8)
        """
    )


def test_datasets_split_by_slicing_sharding_or_streaming():
    assert _loaded("ds = full[rank::world]\nDataLoader(ds)\n")
    assert _loaded("from datasets import load_dataset\nds = load_dataset('c4', streaming=True)\nDataLoader(ds)\n")
    assert not _loaded("from datasets import load_dataset\nds = load_dataset('c4', streaming=False)\nDataLoader(ds)\n")
    assert _loaded("ds = load_dataset('c4')['train'].shard(8, 0)\nDataLoader(ds)\n")
    assert _loaded("import webdataset as wds\nDataLoader(wds.WebDataset(urls))\n")
    assert _loaded("parts = [a, split_dataset_by_node(b, rank=0, world_size=2)]\nDataLoader(ConcatDataset(parts))\n")


def test_local_classes_that_iterate_or_read_the_rank():
    assert _loaded(
        """
        from torch.utils.data import IterableDataset
        class Lines(IterableDataset):
            pass
        DataLoader(Lines(path))
        """
    )
    assert _loaded(
        """
        import os
        class Part:
            def __init__(self):
                self.rank = int(os.environ["RANK"])
        DataLoader(Part())
        """
    )


def test_the_rank_that_picks_a_device_is_not_a_split():
    facts = _facts("ds = Data(device=local_rank)\nmodel.to(rank)\nx = get_rank()\n")
    assign, to, get = (facts.parent(facts.parent(c)) for c in facts.calls)
    assert not mentions_rank(facts, assign)
    rank = next(n for n in facts.within(to, cst.Name) if n.value == "rank")
    assert device_use(facts, rank, to)
    assert mentions_rank(facts, get)


def test_iterable_call_by_name_part():
    facts = _facts("StreamingTextDataset(path)\nTextDataset(path)\n")
    assert [iterable_call(facts, c) for c in facts.calls] == [True, False]


def _stream(code: str):
    """``unsplit_stream`` of the dataset given to the script's ``DataLoader``, as source text (None when none)."""
    from lintdist.dataset_split import unsplit_stream

    facts = _facts(code)
    loader = next(c for c in facts.calls if facts.index.module.code_for_node(c.func) == "DataLoader")
    found = unsplit_stream(facts, loader.args[0].value, loader)
    return None if found is None else facts.index.module.code_for_node(found)


def test_a_datasets_stream_is_unsplit_until_split_by_node():
    head = "from datasets import load_dataset\nds = load_dataset('c4', streaming=True)\n"
    assert (
        _stream(head + "ds = ds.map(f).with_format('torch')\nDataLoader(ds)\n") == "load_dataset('c4', streaming=True)"
    )
    assert _stream(head + "DataLoader(ds.shuffle(seed=0))\n") is not None
    assert _stream(head + "ds = split_dataset_by_node(ds, rank=r, world_size=w)\nDataLoader(ds)\n") is None
    assert _stream(head + "if ddp:\n    ds = split_dataset_by_node(ds, rank=r, world_size=w)\nDataLoader(ds)\n") is None
    assert _stream(head + "DataLoader(ds.shard(num_shards=n, index=i))\n") is None
    assert (
        _stream("from datasets import load_dataset\nds = load_dataset('c4', streaming=False)\nDataLoader(ds)\n") is None
    )
    assert _stream("ds = full.to_iterable_dataset()\nDataLoader(ds)\n") == "full.to_iterable_dataset()"
    assert _stream("import webdataset as wds\nDataLoader(wds.WebDataset(urls))\n") is None
    assert _stream("DataLoader(unknown)\n") is None


def test_an_iterable_subclass_is_unsplit_unless_it_reads_the_rank():
    worker_only = textwrap.dedent(
        """
        from torch.utils.data import DataLoader, IterableDataset, get_worker_info
        class Rows(IterableDataset):
            def __iter__(self):
                info = get_worker_info()
                yield from range(info.id, 10, info.num_workers)
        DataLoader(Rows())
        """
    )
    assert _stream(worker_only) == "Rows()"
    assert _stream(worker_only.replace("DataLoader(Rows())", "DataLoader(Rows(rank))")) is None
    by_rank = worker_only.replace("info.id, 10, info.num_workers", "dist.get_rank(), 10, dist.get_world_size()")
    assert _stream(by_rank) is None
    helper = worker_only.replace("yield from range(info.id, 10, info.num_workers)", "yield from mine()")
    assert _stream(helper + "def mine():\n    return range(rank, 10, world)\n") is None
    imported_base = worker_only.replace("class Rows(IterableDataset)", "class Rows(ShardedBase)")
    assert _stream("from base import ShardedBase\n" + imported_base) is None
