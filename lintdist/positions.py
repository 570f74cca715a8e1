"""Line and column of nodes, as libcst's ``PositionProvider`` gives them, at about the cost of printing the module.

``PositionProvider`` prints the module and, for every token, splits it on newlines and moves a
line/column cursor, and for every node builds position objects: about twice a parse. Positions
are wanted only for the few nodes that end up in a finding, so this records, for every node,
just the number of tokens printed before and after it (two integers), and turns the numbers of
the nodes asked about into lines and columns afterwards, from the file's text. The rules for
where a node starts and ends (``record_syntactic_position``: a ``def`` starts at ``def``, not at
its decorators) are libcst's own, since libcst's printing code calls them.
"""

from __future__ import annotations

import ast
import re
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import accumulate

import libcst as cst
from libcst._nodes.internal import CodegenState

NEWLINE = re.compile(r"\r\n?|\n")


@dataclass(frozen=False)
class _TokenMarks(CodegenState):
    ranges: dict[int, tuple[int, int]] = field(default_factory=dict)
    _stack: list[int] = field(default_factory=list)

    def before_codegen(self, node: cst.CSTNode) -> None:
        self._stack.append(len(self.tokens))

    def after_codegen(self, node: cst.CSTNode) -> None:
        start = self._stack.pop()
        key = id(node)
        if key not in self.ranges:  # a syntactic position, recorded inside, wins (as in libcst)
            self.ranges[key] = (start, len(self.tokens))

    def pop_trailing_newline(self) -> None:
        """Keep it: libcst's positions count the final newline that the printed module then drops."""

    @contextmanager
    def record_syntactic_position(
        self, node: cst.CSTNode, *, start_node: cst.CSTNode | None = None, end_node: cst.CSTNode | None = None
    ) -> Iterator[None]:
        start = len(self.tokens)
        try:
            yield
        finally:
            end = len(self.tokens)
            if start_node is not None:
                start = self.ranges[id(start_node)][0]
            if end_node is not None:
                end = self.ranges[id(end_node)][1]
            self.ranges[id(node)] = (start, end)


class _Printed:
    """One node printed alone, with the token numbers of every node inside it and its text's line starts."""

    def __init__(self, node: cst.CSTNode, module: cst.Module, indents: list[str], elif_: bool = False) -> None:
        state = _TokenMarks(default_indent=module.default_indent, default_newline=module.default_newline)
        state.indent_tokens = list(indents)
        if elif_:  # an `elif` is an If that its parent If prints as `elif`
            node._codegen(state, is_elif=True)
        else:
            node._codegen(state)
        self.ranges = state.ranges
        self.offsets = [0, *accumulate(len(token) for token in state.tokens)]
        self.text = "".join(state.tokens)
        self.line_starts = [0, *(match.end() for match in NEWLINE.finditer(self.text))]

    def range(self, node: cst.CSTNode, shift: int = 0) -> tuple[int, int, int, int]:
        start, end = self.ranges[id(node)]
        line, column = self._place(self.offsets[start])
        end_line, end_column = self._place(self.offsets[end])
        return line + shift, column, end_line + shift, end_column

    def line(self, number: int) -> str:
        """The text of a 1-based line, without its line break."""
        start = self.line_starts[number - 1]
        end = self.line_starts[number] if number < len(self.line_starts) else len(self.text)
        return self.text[start:end].rstrip("\r\n")

    def _place(self, offset: int) -> tuple[int, int]:
        line = bisect_right(self.line_starts, offset)
        return line, offset - self.line_starts[line - 1]


class Positions:
    """1-based lines and 0-based columns of a module's nodes (libcst's ``CodeRange`` numbers).

    Printing the whole module costs about half a parse. Most findings need far less: only the
    innermost statement around a node is printed, with the indentation of its blocks, to place the
    node inside it; a compound statement is printed as its headline (its blocks cut to ``pass``)
    unless the node lies in its blocks, and it ends where its last simple statement ends. The
    statement starts a line of the file that reads as its printed first line: where only one line
    reads so, that is its line; else Python's own ``ast`` gives the line of every statement, paired
    with libcst's statements block by block. The printed line must read as the file's line, else
    (and wherever ``ast`` cannot parse what libcst can, or the pairing fails) the whole module is
    printed.
    """

    def __init__(self, module: cst.Module, text: str, parent: Callable[[cst.CSTNode], cst.CSTNode | None]) -> None:
        self._module = module
        self._text = text
        self._parent = parent
        self._statement_lines: dict[int, int] | None = None
        self._source_lines: list[str] | None = None
        self._printed: dict[tuple[int, bool], tuple[_Printed, int, cst.CSTNode] | None] = {}
        self._whole: _Printed | None = None
        self._once: dict[str, int] | None = None

    def range(self, node: cst.CSTNode) -> tuple[int, int, int, int]:
        """(start line, start column, end line, end column) of ``node``."""
        statement = node
        while statement is not None and not isinstance(statement, cst.BaseStatement):
            statement = self._parent(statement)
        if statement is not None:
            found = self._statement(statement, _headline(statement))
            if found is not None:
                printed, shift, root = found
                if root is not statement and node is statement:  # ends where its last simple statement ends
                    return (*printed.range(root, shift)[:2], *self.range(_last_line(statement))[2:])
                if id(node) in printed.ranges:
                    return printed.range(node, shift)
                found = self._statement(statement, statement)  # a node of the body the headline left out
                if found is not None:
                    return found[0].range(node, found[1])
        if self._whole is None:
            self._whole = _Printed(self._module, self._module, [])
        return self._whole.range(node)

    def _statement(
        self, statement: cst.BaseStatement, root: cst.BaseStatement
    ) -> tuple[_Printed, int, cst.CSTNode] | None:
        """``root`` (``statement`` or its headline) printed alone, and the shift from its lines to the file's."""
        key = (id(statement), root is statement)
        if key in self._printed:
            return self._printed[key]
        indents = []
        ancestor = self._parent(statement)
        while ancestor is not None:
            if isinstance(ancestor, cst.IndentedBlock):
                indents.append(self._module.default_indent if ancestor.indent is None else ancestor.indent)
            ancestor = self._parent(ancestor)
        elif_ = isinstance(statement, cst.If) and isinstance(self._parent(statement), cst.If)
        printed = _Printed(root, self._module, indents[::-1], elif_)
        first = printed.range(root)[0]
        text = printed.line(first)
        # A statement starts a line of the file that reads as its printed first line: where only one line of the
        # file reads so, that is the statement's line, and ``ast`` is not needed.
        line = self._unique_lines().get(text)
        if line is None:
            line = self._lines().get(id(statement))
        found = None
        if line is not None and 0 < line <= len(self._source_lines) and self._source_lines[line - 1] == text:
            found = (printed, line - first, root)
        self._printed[key] = found
        return found

    def _unique_lines(self) -> dict[str, int]:
        """The file's lines that occur once, and their numbers."""
        if self._once is None:
            self._source_lines = NEWLINE.split(self._text)
            seen: dict[str, int] = {}
            for number, text in enumerate(self._source_lines, 1):
                seen[text] = 0 if text in seen else number
            self._once = {text: number for text, number in seen.items() if number}
        return self._once

    def _lines(self) -> dict[int, int]:
        """Statement -> the line ``ast`` gives it; empty where ``ast`` and libcst do not pair up."""
        if self._statement_lines is None:
            self._statement_lines = {}
            try:
                tree = ast.parse(self._text)
                _pair(self._module.body, tree.body, self._statement_lines)
            except (SyntaxError, ValueError, RecursionError, MemoryError, _Mismatch):
                self._statement_lines = {}
        return self._statement_lines


_PASS = cst.SimpleStatementLine([cst.Pass()])


def _last_line(statement: cst.BaseStatement) -> cst.BaseStatement | None:
    """The simple statement a compound statement ends with (libcst ends the compound where it ends), if it ends
    in an indented block."""
    while isinstance(statement, cst.BaseCompoundStatement):
        if isinstance(statement, cst.If) and isinstance(statement.orelse, cst.If):
            statement = statement.orelse
            continue
        if isinstance(statement, (cst.Try, cst.TryStar)):
            last = statement.finalbody or statement.orelse or (statement.handlers[-1] if statement.handlers else None)
        elif isinstance(statement, cst.Match):
            last = statement.cases[-1] if statement.cases else None
        else:
            last = getattr(statement, "orelse", None) or statement
        block = getattr(last, "body", None)
        if not isinstance(block, cst.IndentedBlock) or not block.body:
            return None
        statement = block.body[-1]
    return statement


def _headline(statement: cst.BaseStatement) -> cst.BaseStatement:
    """A compound statement with its blocks cut to ``pass``: the same header nodes, printed at a fraction of the
    cost of a long body. The statement itself where that cannot be done."""
    if not isinstance(statement, (cst.If, cst.For, cst.While, cst.With, cst.FunctionDef, cst.ClassDef)):
        return statement
    if not isinstance(statement.body, cst.IndentedBlock) or _last_line(statement) is None:
        return statement
    changes: dict[str, object] = {"body": statement.body.with_changes(body=[_PASS], footer=[])}
    if not isinstance(statement, (cst.With, cst.FunctionDef, cst.ClassDef)):
        changes["orelse"] = None
    return statement.with_changes(**changes)


class _Mismatch(Exception):
    pass


def _pair(statements: Sequence[cst.CSTNode], nodes: list[ast.stmt], lines: dict[int, int]) -> None:
    """Record the ``ast`` line of each libcst statement of one block (the two lists describe the same block)."""
    at = 0
    for statement in statements:
        if at >= len(nodes):
            raise _Mismatch
        lines[id(statement)] = nodes[at].lineno
        if isinstance(statement, cst.SimpleStatementLine):
            at += len(statement.body)  # `a = 1; b = 2` is one libcst line, two ast statements
        else:
            _pair_compound(statement, nodes[at], lines)
            at += 1
    if at != len(nodes):
        raise _Mismatch


def _pair_compound(statement: cst.CSTNode, node: ast.stmt, lines: dict[int, int]) -> None:
    if isinstance(statement, cst.If):
        if not isinstance(node, ast.If):
            raise _Mismatch
        _pair_block(statement.body, node.body, lines)
        if isinstance(statement.orelse, cst.If):
            _pair([statement.orelse], node.orelse, lines)
        else:
            _pair_else(statement.orelse, node.orelse, lines)
    elif isinstance(statement, (cst.For, cst.While)):
        if not isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            raise _Mismatch
        _pair_block(statement.body, node.body, lines)
        _pair_else(statement.orelse, node.orelse, lines)
    elif isinstance(statement, (cst.With, cst.FunctionDef, cst.ClassDef)):
        if not isinstance(node, (ast.With, ast.AsyncWith, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            raise _Mismatch
        _pair_block(statement.body, node.body, lines)
    elif isinstance(statement, (cst.Try, cst.TryStar)):
        if not isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))) or len(statement.handlers) != len(
            node.handlers
        ):
            raise _Mismatch
        _pair_block(statement.body, node.body, lines)
        for handler, ast_handler in zip(statement.handlers, node.handlers):
            _pair_block(handler.body, ast_handler.body, lines)
        _pair_else(statement.orelse, node.orelse, lines)
        _pair_else(statement.finalbody, node.finalbody, lines)
    elif isinstance(statement, cst.Match):
        if not isinstance(node, getattr(ast, "Match", ())) or len(statement.cases) != len(node.cases):
            raise _Mismatch
        for case, ast_case in zip(statement.cases, node.cases):
            _pair_block(case.body, ast_case.body, lines)
    else:
        raise _Mismatch  # a statement this pairing does not know: print the whole module instead


def _pair_block(block: cst.BaseSuite, nodes: list[ast.stmt], lines: dict[int, int]) -> None:
    if isinstance(block, cst.IndentedBlock):
        _pair(block.body, nodes, lines)
    elif len(block.body) != len(nodes):  # `if x: a; b`: small statements, placed with their compound statement
        raise _Mismatch


def _pair_else(clause: cst.Else | cst.Finally | None, nodes: list[ast.stmt], lines: dict[int, int]) -> None:
    if clause is None:
        if nodes:
            raise _Mismatch
        return
    _pair_block(clause.body, nodes, lines)
