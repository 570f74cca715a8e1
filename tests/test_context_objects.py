"""``lintdist.context_objects``: the object a ``with`` item enters and what the block does with it."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.context_objects import entered_construction, entered_names, method_called_or_escapes
from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex

SYNC = frozenset({"sync.Sync"})


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


def _ask(code: str) -> tuple[cst.Call | None, set[str] | None, bool]:
    facts = _facts(code)
    with_node = facts.index.nodes(cst.With)[-1]
    item = with_node.items[0]
    made = entered_construction(facts, item, with_node, SYNC)
    names = entered_names(item)
    called = made is not None and names is not None and method_called_or_escapes(facts, with_node, made, names, "step")
    return made, names, called


def test_a_construction_entered_directly_or_through_a_name():
    made, names, called = _ask("from sync import Sync\nwith Sync(m) as s:\n    s.step()\n")
    assert made is not None and names == {"s"} and called
    made, names, called = _ask("from sync import Sync\nctx = Sync(m)\nwith ctx:\n    ctx.step()\n")
    assert made is not None and names == {"ctx"} and called
    made, _, _ = _ask("from other import Sync\nwith Sync(m) as s:\n    pass\n")
    assert made is None


def test_a_method_called_in_a_helper_or_an_escape_counts():
    helper = """
        from sync import Sync

        def train(handle):
            handle.step()

        with Sync(m) as s:
            train(s)
    """
    assert _ask(helper)[2]
    escape = "from sync import Sync\nfrom lib import run\nwith Sync(m) as s:\n    run(s)\n"
    assert _ask(escape)[2]
    stored = "from sync import Sync\nwith Sync(m) as s:\n    self.sync = s\n"
    assert _ask(stored)[2]


def test_a_block_that_never_steps_and_an_unpacked_target():
    assert not _ask("from sync import Sync\nwith Sync(m) as s:\n    loss.backward()\n")[2]
    assert not _ask("from sync import Sync\nwith Sync(m):\n    loss.backward()\n")[2]
    assert _ask("from sync import Sync\nwith Sync(m) as (a, b):\n    pass\n")[1] is None
