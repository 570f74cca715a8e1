"""Which DataLoader a loader expression is, its sampler, and whether a framework shards it (``lintdist.loaders``)."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.loaders import (
    batch_loop,
    framework_loader,
    loader_calls,
    passes_batch_labels,
    per_batch_loop,
    plain_loader,
    without_sampler,
)
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


def _loop(facts: PythonFacts) -> cst.For:
    return facts.index.nodes(cst.For)[0]


def _code(facts: PythonFacts, node: cst.CSTNode) -> str:
    return facts.index.module.code_for_node(node)


def test_loader_calls_look_through_iteration_wrappers():
    facts = _facts(
        """
        from torch.utils.data import DataLoader
        loader = DataLoader(ds, batch_size=4)
        for step, batch in enumerate(tqdm(loader)):
            pass
        """
    )
    loop = _loop(facts)
    assert [_code(facts, c.func) for c in loader_calls(facts, loop.iter, loop)] == ["DataLoader"]


def test_a_prepared_loader_has_no_loader_calls():
    facts = _facts(
        """
        loader = DataLoader(ds)
        loader = accelerator.prepare(loader)
        for batch in loader:
            pass
        """
    )
    loop = _loop(facts)
    assert loader_calls(facts, loop.iter, loop) == []


def test_plain_loaders_and_subclasses_that_bring_a_sampler():
    facts = _facts(
        """
        from torch.utils.data import DataLoader
        class Plain(DataLoader):
            pass
        class Balanced(DataLoader):
            def __init__(self, ds):
                super().__init__(ds, sampler=WeightedSampler(ds))
        DataLoader(ds)
        Plain(ds)
        Balanced(ds)
        make_loader(ds)
        """
    )
    calls = [c for c in facts.calls if _code(facts, c.func) in {"DataLoader", "Plain", "Balanced", "make_loader"}]
    assert [plain_loader(facts, c) for c in calls if facts.enclosing_class(c) is None] == [True, True, False, False]


def test_without_sampler():
    calls = [
        cst.parse_expression(text)
        for text in (
            "DataLoader(ds, batch_size=4)",
            "DataLoader(ds, sampler=None)",
            "DataLoader(ds, sampler=s)",
            "DataLoader(ds, 4, False, s)",
            "DataLoader(ds, batch_sampler=b)",
            "DataLoader(ds, **options)",
            "DataLoader(batch_size=4)",
        )
    ]
    assert [without_sampler(c) for c in calls] == [True, True, False, False, False, False, False]


def test_framework_loaders():
    facts = _facts(
        """
        import lightning as L
        class Data(L.LightningDataModule):
            def setup(self):
                self.loader = DataLoader(a)
        def val_dataloader():
            return DataLoader(b)
        c = DataLoader(c)
        c = fabric.setup_dataloaders(c)
        d = DataLoader(d)
        def fit(x):
            pass
        fit(d)
        """
    )
    loaders = [c for c in facts.calls if _code(facts, c.func) == "DataLoader"]
    assert [framework_loader(facts, c) for c in loaders] == [True, True, True, False]


def test_batch_loop_through_enumerate_and_tqdm():
    facts = _facts(
        "from tqdm import tqdm\nfor step, batch in enumerate(tqdm(loader)):\n    pass\nfor a, b in pairs:\n    pass\n"
    )
    first, second = facts.index.nodes(cst.For)
    batch, source = batch_loop(facts, first)
    assert (batch, _code(facts, source)) == ("batch", "loader")
    assert batch_loop(facts, second) == (None, None)


def test_per_batch_loop_needs_a_body_statement_that_no_continue_skips():
    facts = _facts(
        """
        for batch in loader:
            if batch is None:
                continue
            step(batch)
        for batch in loader:
            prepare(batch)
            with accumulate(model):
                step(batch)
        """
    )
    skipping, plain = facts.index.nodes(cst.For)
    assert per_batch_loop(facts, skipping.body.body[1]) is None
    assert per_batch_loop(facts, plain.body.body[1]) is plain
    inner = plain.body.body[1].body.body[0]
    assert per_batch_loop(facts, inner) is None  # inside the `with`: not a statement of the loop's body


def test_passes_batch_labels():
    def call(text: str) -> cst.Call:
        return cst.parse_expression(text)

    assert passes_batch_labels(call('model(input_ids=x, labels=batch["labels"])'), "batch")
    assert passes_batch_labels(call("model(**batch)"), "batch")
    assert not passes_batch_labels(call('model(**batch, labels=batch["targets"])'), "batch")
    assert not passes_batch_labels(call("model(**other)"), "batch")


def test_builds_dataloader_through_aliases_and_subclasses_without_their_own_init():
    from lintdist.loaders import builds_dataloader

    facts = _facts(
        """
        import torch.utils.data as tud
        class Plain(tud.DataLoader):
            pass
        class Own(tud.DataLoader):
            def __init__(self, ds):
                super().__init__(ds)
        class Below(Own):
            pass
        tud.DataLoader(ds)
        Plain(ds)
        Own(ds)
        Below(ds)
        make(ds)
        """
    )
    calls = [c for c in facts.calls if cst.Module([]).code_for_node(c.func) != "super().__init__"]
    calls = [c for c in calls if cst.Module([]).code_for_node(c.func) != "super"]
    assert [builds_dataloader(facts, c) for c in calls] == [True, True, False, False, False]


def test_loader_passes_include_wrapped_loaders_and_iterators():
    from lintdist.loaders import loader_passes

    facts = _facts(
        """
        for batch in loader:
            pass
        for batch in backend.distribute(other):
            pass
        it = iter(third)
        for step in range(10):
            batch = next(it)
        """
    )
    read = [cst.Module([]).code_for_node(expr) for _, expr in loader_passes(facts)]
    assert {"loader", "other", "third"} <= set(read)


def test_prepared_origin_and_drop_last():
    from lintdist.loaders import drops_last, prepared_origin

    facts = _facts(
        """
        from accelerate import Accelerator
        from torch.utils.data import DataLoader
        accelerator = Accelerator()
        eval_loader = DataLoader(ds, batch_size=8, drop_last=True)
        train_loader = DataLoader(ds, batch_size=8)
        model, eval_loader, train_loader = accelerator.prepare(model, eval_loader, train_loader)
        plain = DataLoader(ds)
        for batch in eval_loader:
            pass
        for batch in train_loader:
            pass
        for batch in plain:
            pass
        """
    )
    loops = facts.index.nodes(cst.For)
    origins = [prepared_origin(facts, loop.iter, loop) for loop in loops]
    assert origins[2] is None
    assert [o.index for o in origins[:2]] == [1, 2]
    assert [drops_last(facts, o) for o in origins[:2]] == [True, False]


def test_evaluation_function_and_eval_mode():
    from lintdist.loaders import eval_mode_set, evaluation_function

    facts = _facts(
        """
        def validate(model, loader):
            for batch in loader:
                pass

        def run(model, loader):
            for batch in loader:
                pass
            model.eval()

        def train(model, loader):
            model.eval()
            for batch in loader:
                pass
        """
    )
    loops = facts.index.nodes(cst.For)
    assert [evaluation_function(facts, loop) for loop in loops] == [True, False, False]
    assert [eval_mode_set(facts, loop) for loop in loops] == [False, True, True]
    assert [eval_mode_set(facts, loop, before=True) for loop in loops] == [False, False, True]
