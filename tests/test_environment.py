"""lintdist/environment.py: what a script reads from and writes to its process environment."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.environment import (
    environment_key,
    environment_writes,
    is_environ,
    reads_environment,
    spells_environment,
)
from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


def _value(facts: PythonFacts, name: str) -> cst.BaseExpression:
    """The value assigned to ``name``."""
    for statement in facts.index.nodes(cst.Assign):
        target = statement.targets[0].target
        if isinstance(target, cst.Name) and target.value == name:
            return statement.value
    raise KeyError(name)


def test_keys_read_by_every_spelling():
    facts = _facts(
        """
        import os
        from os import environ, getenv
        a = os.environ["RANK"]
        b = os.environ.get("LOCAL_RANK", "0")
        c = os.getenv("WORLD_SIZE")
        d = environ["MASTER_ADDR"]
        e = getenv(key="MASTER_PORT")
        f = settings["RANK"]
        g = os.environ[name]
        h = config.get("RANK")
        """
    )
    keys = {n: environment_key(facts, _value(facts, n)) for n in "abcdefgh"}
    assert keys == {
        "a": "RANK",
        "b": "LOCAL_RANK",
        "c": "WORLD_SIZE",
        "d": "MASTER_ADDR",
        "e": "MASTER_PORT",
        "f": None,
        "g": None,
        "h": None,
    }
    assert is_environ(facts, _value(facts, "d").value)
    assert not is_environ(facts, _value(facts, "f").value)


def test_reads_follow_names_to_their_assignments():
    facts = _facts(
        """
        import os
        port = os.environ.get("MASTER_PORT") or free_port()
        a = int(port)
        b = 29500
        c = b + 1
        """
    )
    assert reads_environment(facts, _value(facts, "a"))
    assert not reads_environment(facts, _value(facts, "c"))
    assert spells_environment(facts, _value(facts, "port"))
    assert not spells_environment(facts, _value(facts, "a"))


def test_writes_in_file_order_with_their_literal_keys():
    facts = _facts(
        """
        import os
        os.putenv("MASTER_PORT", "29500")
        os.environ["MASTER_ADDR"] = "localhost"
        os.environ.update({"MASTER_PORT": "1", other: "2"}, RANK="0")
        settings["MASTER_ADDR"] = "x"
        os.putenv(name, "1")
        """
    )
    writes = environment_writes(facts)
    assert [(w.how, w.keys) for w in writes] == [
        ("store", ("MASTER_ADDR",)),
        ("putenv", ("MASTER_PORT",)),
        ("update", ("RANK", "MASTER_PORT")),
    ]
    assert isinstance(writes[0].value, cst.SimpleString)
    assert writes[2].value is None
