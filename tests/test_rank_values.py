"""lintdist/rank_values.py: whether a value is the same on every rank, and whether code makes the ranks meet."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.rank_values import (
    code_text,
    counter_name,
    joins_every_rank,
    literal,
    rank_local_reason,
    reads,
    reduced,
    root_key,
    uniform_setting,
)
from lintdist.syntax import SyntaxIndex


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


def _tests(facts: PythonFacts) -> dict[str, cst.If]:
    """The file's ``if`` statements by the code of their test."""
    return {facts.index.module.code_for_node(i.test): i for i in facts.index.nodes(cst.If)}


def _reason(facts: PythonFacts, test: str) -> str | None:
    node = _tests(facts)[test]
    return rank_local_reason(facts, node.test, node)


def test_losses_metrics_clocks_and_flags_set_from_them_are_rank_local():
    facts = _facts(
        """
        import time
        start = time.time()
        for batch in loader:
            loss = model(batch)
            if loss.item() < 0.01:
                break
            if val_loss > best_loss:
                bad_epochs += 1
            if time.time() - start > budget:
                break
            if bad_epochs > 5:
                break
            flag = val_loss > 3
            if flag:
                break
        """
    )
    assert _reason(facts, "loss.item() < 0.01") == "`loss.item()`"
    assert _reason(facts, "val_loss > best_loss") == "`val_loss`"
    assert _reason(facts, "time.time() - start > budget") == "`time.time()` (each rank reads its own clock)"
    assert _reason(facts, "bad_epochs > 5") == "`bad_epochs`"
    assert _reason(facts, "flag") == "`flag` (set from `val_loss`)"


def test_settings_counters_and_reduced_values_are_uniform():
    facts = _facts(
        """
        import torch.distributed as dist
        PATIENCE = 3
        limit = 10
        for step, batch in enumerate(loader):
            loss = model(batch)
            total = loss.detach().clone()
            dist.all_reduce(total)
            gathered = accelerator.gather(loss)
            if step >= args.max_steps:
                break
            if completed_steps >= PATIENCE:
                break
            if total.item() < 0.01:
                break
            if gathered.mean() < limit:
                break
            if accelerator.check_trigger():
                break
        """
    )
    for test in ("step >= args.max_steps", "completed_steps >= PATIENCE", "total.item() < 0.01"):
        assert _reason(facts, test) is None, test
    assert _reason(facts, "gathered.mean() < limit") is None
    assert _reason(facts, "accelerator.check_trigger()") is None
    at = _tests(facts)["total.item() < 0.01"]
    assert reduced(facts, "total", at)
    assert reduced(facts, "gathered", at)
    assert not reduced(facts, "loss", at)


def test_uniform_setting_needs_literal_bindings_never_counted():
    facts = _facts(
        """
        def train(patience=3, threshold=compute()):
            wait = 0
            limit = 5
            wait += 1
            check(patience, threshold, wait, limit, args.epochs, self.config.stop, control.should_training_stop)
        """
    )
    (call,) = [c for c in facts.calls if facts.method_name(c) == "check"]
    uniform = {k: uniform_setting(facts, k, call) for k in ("patience", "threshold", "wait", "limit")}
    assert uniform == {"patience": True, "threshold": False, "wait": False, "limit": True}
    assert uniform_setting(facts, "args.epochs", call)
    assert uniform_setting(facts, "self.config.stop", call)
    assert uniform_setting(facts, "control.should_training_stop", call)


def test_joins_every_rank_through_local_helpers():
    facts = _facts(
        """
        def step(loss):
            loss.backward()

        for batch in loader:
            step(model(batch))
        for batch in loader:
            print(batch)
        """
    )
    first, second = facts.index.nodes(cst.For)
    assert joins_every_rank(facts, first.body)
    assert not joins_every_rank(facts, second.body)


def test_small_helpers():
    facts = _facts("f(a.b.c, d[0], g(h), key=e)\n")
    (call,) = [c for c in facts.calls if facts.method_name(c) == "f"]
    assert [facts.index.module.code_for_node(n) for n in reads(facts, call)] == ["a.b.c", "d", "h", "e"]
    assert root_key(cst.parse_expression("losses[0].mean()")) == "losses"
    assert root_key(cst.parse_expression("self.x.y")) == "self.x"
    assert [literal(cst.parse_expression(t)) for t in ("-1", "1e-3", 'float("inf")', "None", "x", "f(1)")] == [
        True,
        True,
        True,
        True,
        False,
        False,
    ]
    assert counter_name("max_train_steps") and counter_name("epoch")
    assert not counter_name("best_step") and not counter_name("patience")


def test_global_rank_followed_through_names_and_conversions():
    from lintdist.rank_values import global_rank, global_rank_read

    facts = _facts(
        """
        import os
        import torch.distributed as dist
        from accelerate import Accelerator
        accelerator = Accelerator()
        rank = dist.get_rank()
        a = rank
        b = int(os.environ["RANK"])
        c = accelerator.process_index
        d = int(os.environ["LOCAL_RANK"])
        e = rank % 8
        f = accelerator.local_process_index
        """
    )
    values = {
        s.targets[0].target.value: s.value
        for s in facts.index.nodes(cst.Assign)
        if isinstance(s.targets[0].target, cst.Name)
    }
    answers = {name: global_rank(facts, values[name], values[name]) for name in "abcdef"}
    assert answers["a"] == "`dist.get_rank()`"
    assert answers["b"] == '`os.environ["RANK"]`'
    assert "process_index" in answers["c"]
    assert answers["d"] is None and answers["e"] is None and answers["f"] is None
    assert global_rank_read(facts, values["a"]) is None  # a name: read elsewhere
    assert global_rank_read(facts, values["rank"]) == "`dist.get_rank()`"


def test_code_text_is_the_source_without_surrounding_whitespace():
    statement = cst.parse_statement("if  loss.item( ) < best :  # noted\n    pass\n")
    assert code_text(statement.test) == "loss.item( ) < best"
    assert code_text(cst.parse_expression("( a + b )")) == "( a + b )"


def test_unconverted_strips_int_and_str_conversions_only():
    from lintdist.rank_values import unconverted

    code = cst.Module([]).code_for_node
    assert code(unconverted(cst.parse_expression('str(int(os.environ["RANK"]))'))) == 'os.environ["RANK"]'
    assert code(unconverted(cst.parse_expression("float(rank)"))) == "float(rank)"
    assert code(unconverted(cst.parse_expression("int()"))) == "int()"


def test_local_rank_followed_through_names_parameters_and_unbound_arguments():
    from lintdist.rank_values import local_rank, local_rank_read

    facts = _facts(
        """
        import os
        import torch.distributed as dist
        from accelerate import Accelerator
        accelerator = Accelerator()
        lr = int(os.environ["LOCAL_RANK"])
        a = lr
        b = int(os.getenv("LOCAL_RANK", "0"))
        c = accelerator.local_process_index
        d = args.local_rank
        e = args.node_rank * 8 + lr
        f = lr if lr != -1 else int(os.environ["RANK"])
        g = dist.get_node_local_rank()
        h = int(os.environ["RANK"])
        i = accelerator.process_index

        def setup(rank):
            return rank

        def unused(rank):
            return rank

        setup(lr)
        """
    )
    values = {
        s.targets[0].target.value: s.value
        for s in facts.index.nodes(cst.Assign)
        if isinstance(s.targets[0].target, cst.Name)
    }
    answers = {name: local_rank(facts, values[name], values[name]) for name in "abcdefghi"}
    assert answers["a"] == answers["b"] == '`os.environ["LOCAL_RANK"]`'
    assert "local_process_index" in answers["c"]
    assert "--local_rank" in answers["d"]
    assert answers["g"] == "`dist.get_node_local_rank()`"
    # computed from it, or only sometimes it, or the global rank: not the local rank
    assert answers["e"] is None and answers["f"] is None and answers["h"] is None and answers["i"] is None
    assert local_rank_read(facts, values["a"]) is None  # a name: read elsewhere
    returns = {f.name.value: facts.returns[f][0] for f in facts.index.nodes(cst.FunctionDef)}
    assert local_rank(facts, returns["setup"], returns["setup"]) == '`os.environ["LOCAL_RANK"]`'
    assert local_rank(facts, returns["unused"], returns["unused"]) is None  # a parameter with no caller


def test_local_rank_in_scope_names_a_binding_before_the_statement():
    from lintdist.rank_values import local_rank_in_scope

    facts = _facts(
        """
        import os
        from accelerate import Accelerator

        def with_name():
            local_rank = int(os.environ["LOCAL_RANK"])
            here = 1

        def with_accelerator():
            accelerator = Accelerator()
            here = 2

        def with_none():
            here = 3
            local_rank = int(os.environ["LOCAL_RANK"])
        """
    )
    statements = {s.value.value: s for s in facts.index.nodes(cst.Assign) if isinstance(s.value, cst.Integer)}
    assert local_rank_in_scope(facts, statements["1"]) == "local_rank"
    assert local_rank_in_scope(facts, statements["2"]) == "accelerator.local_process_index"
    assert local_rank_in_scope(facts, statements["3"]) is None  # bound after it
