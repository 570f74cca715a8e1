"""lintdist/datasets.py: where a dataset comes from, and what preparing it writes that every rank would share."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.datasets import (
    dataset_sources,
    holds_url,
    is_load_dataset,
    loaded_dataset,
    names_rank,
    reads_local_files,
    shared_preparation,
    string_prefix,
)
from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


def _call(facts: PythonFacts, text: str) -> cst.Call:
    """The first call whose callee reads ``text``."""
    module = facts.index.module
    return next(c for c in facts.calls if module.code_for_node(c.func) == text)


def _code(facts: PythonFacts, node: cst.CSTNode) -> str:
    return facts.index.module.code_for_node(node)


def test_load_dataset_is_known_by_alias_and_by_a_variable_bound_to_it():
    facts = _facts(
        """
        from datasets import load_dataset as ld, load_from_disk
        reader = load_from_disk if cached else ld
        a = ld("glue")
        b = reader("corpus")
        c = load_from_disk("cache/")
        """
    )
    assert is_load_dataset(facts, _call(facts, "ld"))
    assert is_load_dataset(facts, _call(facts, "reader"))
    assert not is_load_dataset(facts, _call(facts, "load_from_disk"))


def test_a_dataset_is_traced_through_methods_subscripts_and_helpers_to_its_load():
    facts = _facts(
        """
        from datasets import load_dataset

        def read(name):
            return load_dataset(name, split="train")

        splits = load_dataset("glue").map(f).with_format("torch")
        train = splits["train"]
        mine = read("imdb")
        streamed = load_dataset("c4", streaming=True)
        other = make_dataset()
        train.map(g)
        mine.filter(h)
        streamed.map(g)
        other.map(g)
        """
    )
    receivers = {_code(facts, c.func.value): c for c in facts.calls if facts.method_name(c) in {"map", "filter"}}
    (source,) = dataset_sources(facts, receivers["train"].func.value, receivers["train"])
    assert _code(facts, source) == 'load_dataset("glue")'
    assert loaded_dataset(facts, receivers["mine"].func.value, receivers["mine"])
    assert dataset_sources(facts, receivers["streamed"].func.value, receivers["streamed"])
    assert not loaded_dataset(facts, receivers["streamed"].func.value, receivers["streamed"])
    assert not dataset_sources(facts, receivers["other"].func.value, receivers["other"])


def test_urls_are_found_in_literals_f_strings_containers_and_names():
    facts = _facts(
        """
        base = "https://host/data"
        load_dataset("json", data_files={"train": f"hf://datasets/{name}/0.parquet"})
        load_dataset("json", data_files=[base + "/a.json"])
        load_dataset("json", data_files="train.jsonl")
        load_dataset("./local")
        load_dataset("glue", data_dir=folder if x else other)
        """
    )
    calls = [c for c in facts.calls if _code(facts, c.func) == "load_dataset"]
    hf, joined, local, _, _ = calls
    assert holds_url(facts, hf.args[1].value, hf)
    assert holds_url(facts, joined.args[1].value, joined)
    assert not holds_url(facts, local.args[1].value, local)
    assert [reads_local_files(facts, c) for c in calls] == [False, False, True, True, True]
    assert string_prefix(cst.parse_expression('f"s3://{bucket}/x"')) == "s3://"


def test_names_rank_reads_the_rank_anywhere_in_the_expression():
    facts = _facts('f"./data{local_rank}"\nurls[dist.get_rank()::n]\nf"./data{epoch}"\n')
    first, second, third = (s.body[0].value for s in facts.index.module.body)
    assert names_rank(facts, first)
    assert names_rank(facts, second)
    assert not names_rank(facts, third)
    assert not names_rank(facts, None)


def test_shared_preparation_names_what_every_rank_would_write():
    facts = _facts(
        """
        import torch
        import torchvision
        from urllib.request import urlretrieve
        from datasets import load_dataset

        raw = load_dataset("glue", "mrpc")
        raw.map(tokenize)
        raw.map(tokenize, keep_in_memory=True)
        raw.filter(keep, load_from_cache_file=False)
        load_dataset("glue", cache_dir="s3://bucket/cache")
        load_dataset("glue", cache_dir=f"/tmp/{rank}")
        torchvision.datasets.MNIST("data", download=True)
        torchvision.datasets.MNIST(f"data{rank}", download=True)
        torch.hub.load("repo", "model")
        urlretrieve(url, "a.tar")
        urlretrieve(url, f"shard{rank}.tar")
        """
    )
    kinds = [shared_preparation(facts, c) for c in facts.calls]
    assert kinds == [None, "map", None, None, "remote_cache", None, "torchvision", None, "hub", "url", None]
