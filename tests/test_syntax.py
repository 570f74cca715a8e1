"""Checks lintdist's one-walk syntax index and its positions against the installed libcst, on real files."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import re
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

from lintdist.positions import Positions
from lintdist.syntax import CHILD_FIELDS, SKIPPED_FIELDS, SyntaxIndex

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
VISITED_FIELD = re.compile(r'visit_\w+\(\s*self,\s*"(\w+)"')
# Whitespace holders: their code-looking field (``comment``) is reached only through skipped fields.
NEVER_REACHED = {"EmptyLine", "TrailingWhitespace", "ParenthesizedWhitespace"}
# Nodes the index may leave out: whitespace, comments, parentheses, punctuation and operators.
LAYOUT = (
    cst.BaseParenthesizableWhitespace,
    cst.EmptyLine,
    cst.TrailingWhitespace,
    cst.Comment,
    cst.Newline,
    cst.LeftParen,
    cst.RightParen,
    cst.LeftSquareBracket,
    cst.RightSquareBracket,
    cst.LeftCurlyBrace,
    cst.RightCurlyBrace,
    cst.Comma,
    cst.Semicolon,
    cst.Colon,
    cst.Dot,
    cst.AssignEqual,
    cst.Asynchronous,
    cst.ParamSlash,
    cst.BaseBinaryOp,
    cst.BaseBooleanOp,
    cst.BaseCompOp,
    cst.BaseUnaryOp,
    cst.BaseAugOp,
)


def _node_classes() -> list[type[cst.CSTNode]]:
    found = {}
    for value in vars(cst).values():
        if (
            isinstance(value, type)
            and issubclass(value, cst.CSTNode)
            and dataclasses.is_dataclass(value)
            and not inspect.isabstract(value)
        ):
            found[value.__name__] = value
    return [found[name] for name in sorted(found)]


def _visited_fields(cls: type[cst.CSTNode]) -> tuple[str, ...]:
    """The code-holding fields ``cls._visit_and_replace_children`` visits, in order (``ImportFrom`` names one twice)."""
    source = inspect.getsource(cls._visit_and_replace_children)
    fields = (f for f in VISITED_FIELD.findall(source) if f not in SKIPPED_FIELDS and not f.startswith("whitespace"))
    return tuple(dict.fromkeys(fields))


@pytest.mark.parametrize("cls", _node_classes(), ids=lambda cls: cls.__name__)
def test_child_fields_match_libcst(cls):
    fields = _visited_fields(cls)
    if not fields or cls.__name__ in NEVER_REACHED:
        # Leaves (names, literals, operators, punctuation) have no code children; whitespace nodes are never walked.
        assert cls.__name__ not in CHILD_FIELDS, f"{cls.__name__} has no code children but is in CHILD_FIELDS"
        return
    assert CHILD_FIELDS.get(cls.__name__, ()) == fields, (
        f"CHILD_FIELDS[{cls.__name__!r}] is {CHILD_FIELDS.get(cls.__name__)}; the installed libcst visits {fields}"
    )


def _accelerate_scripts() -> list[Path]:
    spec = importlib.util.find_spec("accelerate")
    if spec is None or spec.origin is None:
        return []
    root = Path(spec.origin).parent
    return sorted((root / "test_utils" / "scripts").rglob("*.py")) + sorted((root / "commands").glob("*.py"))


def _files() -> list:
    fixtures = [
        pytest.param(path, id=f"fixtures/{path.relative_to(FIXTURES)}") for path in sorted(FIXTURES.rglob("*.py"))
    ]
    scripts = [
        pytest.param(path, id=f"accelerate/{path.as_posix().rsplit('/accelerate/', 1)[-1]}")
        for path in _accelerate_scripts()
    ]
    return fixtures + scripts


class _PreOrder(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.nodes: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.nodes.append(node)
        return True


@pytest.mark.parametrize("path", _files())
def test_index_follows_libcst_walk(path):
    module = cst.parse_module(path.read_text(encoding="utf-8"))
    index = SyntaxIndex(module)
    recorder = _PreOrder()
    module.visit(recorder)
    parents = MetadataWrapper(module, unsafe_skip_copy=True).resolve(ParentNodeProvider)
    visited = recorder.nodes

    indexed = index.nodes(*{type(node) for node in visited})
    assert indexed == [node for node in visited if index.order(node) >= 0], "the index is not libcst's pre-order"
    assert [index.order(node) for node in indexed] == list(range(len(indexed)))
    missing = [node for node in visited if index.order(node) < 0 and not isinstance(node, LAYOUT)]
    assert not missing, f"not indexed: {sorted({type(node).__name__ for node in missing})}"

    last_inside = {id(node): index.order(node) for node in indexed}
    for node in indexed[1:]:
        assert index.parent(node) is parents[node], f"parent of {type(node).__name__} at {index.order(node)}"
        ancestor = parents[node]
        while ancestor is not None:
            last_inside[id(ancestor)] = max(last_inside[id(ancestor)], index.order(node))
            ancestor = parents.get(ancestor)
    assert index.parent(module) is None
    assert all(index.end(node) == last_inside[id(node)] + 1 for node in indexed)

    calls = [node for node in visited if isinstance(node, cst.Call)]
    for container in index.nodes(cst.FunctionDef, cst.For, cst.While, cst.With):
        inside = [call for call in calls if _inside(call, container, parents)]
        assert index.within(container, cst.Call) == inside, f"calls within the {type(container).__name__}"


def _inside(node: cst.CSTNode, container: cst.CSTNode, parents) -> bool:
    ancestor = parents.get(node)
    while ancestor is not None:
        if ancestor is container:
            return True
        ancestor = parents.get(ancestor)
    return False


@pytest.mark.parametrize("path", _files())
def test_positions_match_libcst_position_provider(path):
    text = path.read_text(encoding="utf-8")
    # also without the final newline (libcst's positions still count it) and with CRLF line endings
    for source in (text, text.rstrip("\n"), text.replace("\n", "\r\n")):
        module = cst.parse_module(source)
        expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
        index = SyntaxIndex(module)
        positions = Positions(module, source, index.parent)
        for node in index.nodes(*{type(n) for n in expected}):
            where = expected[node]
            wanted = (where.start.line, where.start.column, where.end.line, where.end.column)
            assert positions.range(node) == wanted, f"{type(node).__name__} in {path.name}"


def test_nodes_and_within_take_base_classes_as_isinstance_does():
    module = cst.parse_module("def f(x):\n    y = x\n    return y\n\nimport os\nz = f(1)\n")
    index = SyntaxIndex(module)
    small = index.nodes(cst.BaseSmallStatement)
    assert [type(n).__name__ for n in small] == ["Assign", "Return", "Import", "Assign"]
    function = index.nodes(cst.FunctionDef)[0]
    assert [type(n).__name__ for n in index.within(function, cst.BaseSmallStatement)] == ["Assign", "Return"]
    built = cst.parse_statement("if x:\n    a = 1\n    pass\n")  # not in the module: a plain walk, same answer
    assert [type(n).__name__ for n in index.within(built, cst.BaseSmallStatement)] == ["Assign", "Pass"]


TRICKY = '''"""
if ready:
    step()
"""
@decorated
def train(model):  # trailing comment
    if ready:
        step()
    elif other:
        step()
    else:
        for batch in loader:
            step()
        # a comment after the body
    if ready:
        step()
    try:
        step()
    except ValueError:
        pass
    with ctx() as c: step()
    while False:
        step()
    else:
        done()
'''


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_positions_of_each_node_asked_first_match_libcst(newline):
    # Each node asked of a fresh Positions, so that no statement printed for an earlier node places it: compound
    # statements by their headline, lines that occur more than once (and inside a docstring), elif chains.
    source = TRICKY.replace("\n", newline)
    module = cst.parse_module(source)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    index = SyntaxIndex(module)
    for node in index.nodes(*{type(n) for n in expected}):
        where = expected[node]
        wanted = (where.start.line, where.start.column, where.end.line, where.end.column)
        assert Positions(module, source, index.parent).range(node) == wanted, type(node).__name__
