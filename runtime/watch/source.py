"""Read the user's file at report time: the rank guard around a line, the loop it is in, that loop's early exits."""

from __future__ import annotations

import ast
import linecache
import re
from dataclasses import dataclass
from functools import lru_cache

from lintdist.runtime.watch.probe import Site

# Names that make an `if` test a rank test (raw torch, accelerate, Lightning, transformers, the usual variables).
RANK_WORDS = re.compile(
    r"\b(\w*rank\w*|is_main_process|is_local_main_process|is_world_process_zero|is_local_process_zero|"
    r"is_global_zero|process_index|local_process_index|main_process\w*|is_master\w*)\b"
)

_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


@dataclass(frozen=True)
class Guard:
    """An `if` around a line whose test reads a rank."""

    line: int
    test: str
    branch: str  # "if" or "else"

    def describe(self) -> str:
        return f"`if {self.test}:`" if self.branch == "if" else f"the `else` of `if {self.test}:`"


@dataclass(frozen=True)
class Exit:
    """A `break`, `return` or exit call inside a loop, with the `if` that takes it."""

    line: int
    kind: str
    condition: str | None
    condition_line: int | None


def line_text(site: Site) -> str:
    return linecache.getline(site.file, site.line).strip()


@lru_cache(maxsize=64)
def _tree(path: str) -> tuple[ast.AST, dict[ast.AST, ast.AST], str] | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
        tree = ast.parse(text, filename=path)
    except (OSError, SyntaxError, ValueError):
        return None
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    return tree, parents, text


def _around(site: Site | None) -> tuple[list[tuple[ast.AST, ast.AST]], dict[ast.AST, ast.AST], str] | None:
    """The nodes around `site`'s statement, innermost first, up to its function: (parent, child) pairs."""
    parsed = _tree(site.file) if site is not None else None
    if parsed is None:
        return None
    tree, parents, text = parsed
    best = None
    for node in ast.walk(tree):
        inside = isinstance(node, ast.stmt) and node.lineno <= site.line <= (node.end_lineno or node.lineno)
        if inside and (best is None or (node.end_lineno or 0) - node.lineno <= (best.end_lineno or 0) - best.lineno):
            best = node
    if best is None:
        return None
    chain = []
    for parent, child in _ancestors(best, parents):
        if isinstance(parent, _SCOPES):
            break
        chain.append((parent, child))
    return chain, parents, text


def _ancestors(node: ast.AST, parents: dict[ast.AST, ast.AST]):
    child = node
    while child in parents:
        parent = parents[child]
        yield parent, child
        child = parent


def _is_rank_test(test: str) -> bool:
    return bool(RANK_WORDS.search(test))


def rank_guard(site: Site | None) -> Guard | None:
    """The innermost `if` around `site` in its function whose test reads a rank."""
    found = _around(site)
    for parent, child in found[0] if found else ():
        if isinstance(parent, ast.If):
            test = ast.get_source_segment(found[2], parent.test) or ast.unparse(parent.test)
            if _is_rank_test(test):
                return Guard(parent.lineno, " ".join(test.split()), "if" if child in parent.body else "else")
    return None


@dataclass(frozen=True)
class Loop:
    file: str
    line: int
    end_line: int
    header: str
    exits: tuple[Exit, ...]

    def contains(self, site: Site | None) -> bool:
        return site is not None and site.file == self.file and self.line <= site.line <= self.end_line


def enclosing_loop(site: Site | None) -> Loop | None:
    """The innermost loop around `site` in its function, with its early exits (`break`, `return`, `sys.exit`)."""
    found = _around(site)
    loop = next((parent for parent, _ in found[0] if isinstance(parent, _LOOPS)), None) if found else None
    if loop is None:
        return None
    _chain, parents, text = found
    header = text.splitlines()[loop.lineno - 1].strip()
    return Loop(site.file, loop.lineno, loop.end_lineno or loop.lineno, header, tuple(_exits(loop, parents, text)))


def _exits(loop: ast.AST, parents: dict[ast.AST, ast.AST], text: str) -> list[Exit]:
    exits = []
    stack = list(ast.iter_child_nodes(loop))
    while stack:
        node = stack.pop()
        if isinstance(node, _SCOPES):
            continue
        kind = None
        if isinstance(node, ast.Break) and _owning_loop(node, parents) is loop:
            kind = "break"
        elif isinstance(node, ast.Return):
            kind = "return"
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in {"sys.exit", "exit", "quit", "os._exit"}:
            kind = ast.unparse(node.func)
        if kind:
            condition = next((p for p, _ in _ancestors(node, parents) if isinstance(p, ast.If) or p is loop), None)
            test = None
            if isinstance(condition, ast.If):
                test = " ".join((ast.get_source_segment(text, condition.test) or ast.unparse(condition.test)).split())
            exits.append(Exit(node.lineno, kind, test, condition.lineno if test else None))
        stack.extend(ast.iter_child_nodes(node))
    return sorted(exits, key=lambda item: item.line)


def _owning_loop(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> ast.AST | None:
    for parent, _child in _ancestors(node, parents):
        if isinstance(parent, _LOOPS):
            return parent
        if isinstance(parent, _SCOPES):
            return None
    return None


def local_exits(loop: Loop) -> list[Exit]:
    """The loop's exits taken under a condition that is not a rank test: a value each rank computes for itself."""
    return [item for item in loop.exits if item.condition and not _is_rank_test(item.condition)]


def range_bound(site: Site | None, frame_locals: dict, frame_globals: dict) -> int | None:
    """The bound N of the innermost `for ... in range(N)` loop around `site`, read from the frame's variables.

    Only names, attributes and subscripts with constant keys are evaluated; a call anywhere gives None.
    """
    found = _around(site)
    for parent, _child in found[0] if found else ():
        if (
            isinstance(parent, ast.For)
            and isinstance(parent.iter, ast.Call)
            and ast.unparse(parent.iter.func) == "range"
        ):
            args = parent.iter.args
            if len(args) not in (1, 2) or not all(_plain(arg) for arg in args):
                continue
            try:
                values = [
                    eval(compile(ast.Expression(arg), site.file, "eval"), dict(frame_globals), dict(frame_locals))
                    for arg in args
                ]
            except Exception:  # noqa: BLE001 - a name the frame does not hold, or an attribute that raises
                return None
            if all(isinstance(value, int) for value in values):
                return values[-1] - (values[0] if len(values) == 2 else 0)
    return None


def _plain(node: ast.AST) -> bool:
    return all(
        isinstance(part, (ast.Name, ast.Attribute, ast.Constant, ast.Subscript, ast.Load, ast.BinOp, ast.operator))
        for part in ast.walk(node)
    )
