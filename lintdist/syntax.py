"""One walk over a libcst module: parents, source-order numbers, and indexes of nodes by type.

libcst's own traversal rebuilds every node it passes and its metadata providers (parents,
scopes, qualified names) are a full traversal each. lintdist needs the tree read, not
rebuilt: this walk follows the child fields that hold code (not whitespace, parentheses or
punctuation) in libcst's visiting order, numbers each node in pre-order and remembers where
its subtree ends, so "is this node inside that one?" and "which calls are inside this loop?"
are answered by comparing numbers instead of walking again.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterator

import libcst as cst

# The child fields that hold code, per node class, in the order libcst visits them
# (``tests/test_syntax.py`` checks this table against the installed libcst).
CHILD_FIELDS: dict[str, tuple[str, ...]] = {
    "AnnAssign": ("target", "annotation", "value"),
    "Annotation": ("annotation",),
    "Arg": ("keyword", "value"),
    "AsName": ("name",),
    "Assert": ("test", "msg"),
    "Assign": ("targets", "value"),
    "AssignTarget": ("target",),
    "Attribute": ("value", "attr"),
    "AugAssign": ("target", "value"),
    "Await": ("expression",),
    "BinaryOperation": ("left", "right"),
    "BooleanOperation": ("left", "right"),
    "Call": ("func", "args"),
    "ClassDef": ("decorators", "name", "type_parameters", "bases", "keywords", "body"),
    "CompFor": ("target", "iter", "ifs", "inner_for_in"),
    "CompIf": ("test",),
    "Comparison": ("left", "comparisons"),
    "ComparisonTarget": ("comparator",),
    "ConcatenatedString": ("left", "right"),
    "Decorator": ("decorator",),
    "Del": ("target",),
    "Dict": ("elements",),
    "DictComp": ("key", "value", "for_in"),
    "DictElement": ("key", "value"),
    "Element": ("value",),
    "Else": ("body",),
    "ExceptHandler": ("type", "name", "body"),
    "ExceptStarHandler": ("type", "name", "body"),
    "Expr": ("value",),
    "Finally": ("body",),
    "For": ("target", "iter", "body", "orelse"),
    "FormattedString": ("parts",),
    "FormattedStringExpression": ("expression", "format_spec"),
    "From": ("item",),
    "FunctionDef": ("decorators", "name", "type_parameters", "params", "returns", "body"),
    "GeneratorExp": ("elt", "for_in"),
    "Global": ("names",),
    "If": ("test", "body", "orelse"),
    "IfExp": ("body", "test", "orelse"),
    "Import": ("names",),
    "ImportAlias": ("name", "asname"),
    "ImportFrom": ("module", "names"),
    "IndentedBlock": ("body",),
    "Index": ("value",),
    "Lambda": ("params", "body"),
    "LazyImport": ("names",),
    "LazyImportFrom": ("module", "names"),
    "List": ("elements",),
    "ListComp": ("elt", "for_in"),
    "Match": ("subject", "cases"),
    "MatchAs": ("pattern", "name"),
    "MatchCase": ("pattern", "guard", "body"),
    "MatchClass": ("cls", "patterns", "kwds"),
    "MatchKeywordElement": ("key", "pattern"),
    "MatchList": ("patterns",),
    "MatchMapping": ("elements", "rest"),
    "MatchMappingElement": ("key", "pattern"),
    "MatchOr": ("patterns",),
    "MatchOrElement": ("pattern",),
    "MatchSequenceElement": ("value",),
    "MatchSingleton": ("value",),
    "MatchStar": ("name",),
    "MatchTuple": ("patterns",),
    "MatchValue": ("value",),
    "Module": ("body",),
    "NameItem": ("name",),
    "NamedExpr": ("target", "value"),
    "Nonlocal": ("names",),
    "Param": ("name", "annotation", "default"),
    "ParamSpec": ("name",),
    "Parameters": ("posonly_params", "params", "star_arg", "kwonly_params", "star_kwarg"),
    "Raise": ("exc", "cause"),
    "Return": ("value",),
    "Set": ("elements",),
    "SetComp": ("elt", "for_in"),
    "SimpleStatementLine": ("body",),
    "SimpleStatementSuite": ("body",),
    "Slice": ("lower", "upper", "step"),
    "StarredDictComp": ("value", "for_in"),
    "StarredDictElement": ("value",),
    "StarredElement": ("value",),
    "Subscript": ("value", "slice"),
    "SubscriptElement": ("slice",),
    "TemplatedString": ("parts",),
    "TemplatedStringExpression": ("expression", "format_spec"),
    "Try": ("body", "handlers", "orelse", "finalbody"),
    "TryStar": ("body", "handlers", "orelse", "finalbody"),
    "Tuple": ("elements",),
    "TypeAlias": ("name", "type_parameters", "value"),
    "TypeParam": ("param", "default"),
    "TypeParameters": ("params",),
    "TypeVar": ("name", "bound"),
    "TypeVarTuple": ("name",),
    "UnaryOperation": ("expression",),
    "While": ("test", "body", "orelse"),
    "With": ("items", "body"),
    "WithItem": ("item", "asname"),
    "Yield": ("value",),
}
# Fields that hold only whitespace, comments, parentheses or punctuation: never walked.
SKIPPED_FIELDS = frozenset(
    {"lpar", "rpar", "lbracket", "rbracket", "lbrace", "rbrace", "leading_lines", "lines_after_decorators"}
    | {"header", "footer", "comma", "semicolon", "trailing_whitespace", "leading_whitespace", "equal", "colon"}
    | {"first_colon", "second_colon", "dot", "asynchronous", "trailing_comma", "posonly_ind", "operator"}
    | {"relative", "star", "indent", "newline", "encoding", "default_indent", "default_newline", "separator"}
    | {"has_trailing_newline", "start", "end", "conversion"}
)
_FIELDS_BY_CLASS: dict[type, tuple[str, ...]] = {}
# class -> is it a libcst node (CSTNode is an ABC: isinstance on it is slow enough to show in a profile)
_IS_NODE: dict[type, bool] = {}


def child_fields(cls: type) -> tuple[str, ...]:
    """The code-holding fields of a node class (for a class this libcst is newer than the table, its dataclass
    fields minus whitespace and punctuation)."""
    fields = _FIELDS_BY_CLASS.get(cls)
    if fields is None:
        fields = CHILD_FIELDS.get(cls.__name__)
        if fields is None:
            fields = tuple(
                f.name
                for f in dataclasses.fields(cls)
                if f.name not in SKIPPED_FIELDS and not f.name.startswith("whitespace")
            )
        _FIELDS_BY_CLASS[cls] = fields
    return fields


def _is_node_class(kind: type) -> bool:
    """Whether instances of ``kind`` are libcst nodes (cached per class)."""
    known = _IS_NODE.get(kind)
    if known is None:
        known = _IS_NODE[kind] = issubclass(kind, cst.CSTNode)
    return known


def children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """The code-holding children of ``node`` in source order (``SyntaxIndex`` inlines the same loop)."""
    result = []
    for name in child_fields(node.__class__):
        value = getattr(node, name)
        kind = value.__class__
        if _is_node_class(kind):
            result.append(value)
        elif kind is tuple or kind is list:
            result.extend(item for item in value if _is_node_class(item.__class__))
    return result


class SyntaxIndex:
    """Parents, pre-order numbers and nodes by type of one module, from one walk."""

    def __init__(self, module: cst.Module) -> None:
        self.module = module
        self._parent: dict[int, cst.CSTNode | None] = {}
        self._start: dict[int, int] = {}
        self._end: dict[int, int] = {}
        self._by_type: dict[type, list[cst.CSTNode]] = defaultdict(list)
        self._subclasses: dict[tuple[type, ...], list[type]] = {}
        self._walk(module)

    def _walk(self, module: cst.Module) -> None:
        parent_of, start, end, by_type = self._parent, self._start, self._end, self._by_type
        fields_of, is_node = _FIELDS_BY_CLASS, _IS_NODE
        leave = object()
        stack: list[tuple[object, cst.CSTNode]] = [(None, module)]
        count = 0
        while stack:
            parent, node = stack.pop()
            key = id(node)
            if parent is leave:
                end[key] = count
                continue
            parent_of[key] = parent
            start[key] = count
            count += 1
            cls = node.__class__
            by_type[cls].append(node)
            stack.append((leave, node))
            fields = fields_of.get(cls)
            if fields is None:
                fields = child_fields(cls)
            # children() inlined, with the cache read directly: this loop runs for every node of every file
            pending = []
            for name in fields:
                value = getattr(node, name)
                kind = value.__class__
                node_kind = is_node.get(kind)
                if node_kind is None:
                    node_kind = _is_node_class(kind)
                if node_kind:
                    pending.append((node, value))
                elif kind is tuple or kind is list:
                    for item in value:
                        item_kind = is_node.get(item.__class__)
                        if item_kind is None:
                            item_kind = _is_node_class(item.__class__)
                        if item_kind:
                            pending.append((node, item))
            pending.reverse()
            stack.extend(pending)

    # -- structure ---------------------------------------------------------------------------

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self._parent.get(id(node))

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        parent = self._parent.get(id(node))
        while parent is not None:
            yield parent
            parent = self._parent.get(id(parent))

    def order(self, node: cst.CSTNode) -> int:
        """The node's pre-order number (source order); -1 for a node not in this module."""
        return self._start.get(id(node), -1)

    def end(self, node: cst.CSTNode) -> int:
        """One past the pre-order number of the last node in ``node``'s subtree."""
        return self._end.get(id(node), -1)

    def contains(self, container: cst.CSTNode, node: cst.CSTNode) -> bool:
        """``node`` is a strict descendant of ``container``."""
        start = self._start.get(id(node))
        outer = self._start.get(id(container))
        if start is None or outer is None:
            return False
        return outer < start < self._end[id(container)]

    def _classes(self, types: tuple[type, ...]) -> list[type]:
        """The node classes in this module that are one of ``types`` or derive from one (``BaseSmallStatement``)."""
        found = self._subclasses.get(types)
        if found is None:
            found = self._subclasses[types] = [cls for cls in self._by_type if issubclass(cls, types)]
        return found

    def nodes(self, *types: type) -> list[cst.CSTNode]:
        """Every node of these classes (or their subclasses), in source order."""
        classes = self._classes(types)
        if len(classes) == 1:
            return self._by_type[classes[0]]
        found = [node for cls in classes for node in self._by_type[cls]]
        found.sort(key=lambda n: self._start[id(n)])
        return found

    def within(self, container: cst.CSTNode, *types: type) -> list[cst.CSTNode]:
        """The nodes of these classes (or their subclasses) inside ``container`` (itself included), in source
        order: a binary search in each class's list, no walk."""
        first, last = self._start.get(id(container)), self._end.get(id(container))
        if first is None:
            return _walk_detached(container, types)
        result = []
        classes = self._classes(types)
        for cls in classes:
            nodes = self._by_type[cls]
            low = bisect_left(nodes, first, key=lambda n: self._start[id(n)])
            for node in nodes[low:]:
                if self._start[id(node)] >= last:
                    break
                result.append(node)
        if len(classes) > 1:
            result.sort(key=lambda n: self._start[id(n)])
        return result


def _walk_detached(node: cst.CSTNode, types: tuple[type, ...]) -> list[cst.CSTNode]:
    """``within`` for a node built by a rule (not part of the indexed module): a plain walk of that small tree."""
    found, stack = [], [node]
    while stack:
        current = stack.pop()
        if isinstance(current, types):
            found.append(current)
        stack.extend(reversed(children(current)))
    return found
