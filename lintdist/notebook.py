"""Jupyter notebooks as one Python text: code cells joined, magics masked, and back again.

Each code cell is preceded by a marker comment so that, after a fix, the text
splits back into the same cells; IPython magics and shell escapes become
``pass  # lintdist-magic: ...`` lines (valid Python at any indentation) and are
restored verbatim on the way back.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from lintdist.sources import SourceError

CELL_MARKER = "# lintdist-cell: "
MAGIC = "pass  # lintdist-magic: "
# A line continuing a masked one (`!pip install \`): restored as it was, whatever indentation a fix gave it.
CONTINUED = "pass  # lintdist-continued: "
MAGIC_LINE = re.compile(r"^(\s*)pass  # lintdist-magic: (.*)$")
CONTINUED_LINE = re.compile(r"^\s*pass  # lintdist-continued: (.*)$")
# IPython's escapes at the start of a logical line (IPython.core.inputtransformer2.ESCAPE_SINGLES): `!cmd`, `!!cmd`,
# `%magic`, `?obj`/`??obj`, and the auto-call forms `,f a b`, `;f a b`, `/f x`.
ESCAPES = ("!", "%", "?", ",", ";", "/")
# `obj?`, `obj.attr??`, `%magic?`, `seq[0]?` (IPython's `_help_end_re`)
HELP_END = re.compile(r"^%{0,2}(?!\d)[\w*]+(\.(?!\d)[\w*]+|\[-?[0-9]+\])*\?\??$")
# `files = !ls`, `out = %time f()`: an assignment of a shell escape or a magic (IPython's SystemAssign/MagicAssign)
ASSIGN_ESCAPE = re.compile(r"^[\w.\[\]\s,()*'\"]+?(?<![=!<>])=\s*(!|%\w)")


@dataclass
class Notebook:
    data: dict
    python: str
    # (first line of the cell's code in ``python``, cell number as shown by Jupyter: 1-based over all cells)
    starts: list[tuple[int, int]]
    trailing_newline: dict[int, bool]
    final_newline: bool = True  # whether the file itself ends with a newline (Jupyter writes one)

    def location(self, line: int) -> tuple[int | None, int]:
        """Cell number and line within the cell of a line of ``python``."""
        cell, first = None, 1
        for start, number in self.starts:
            if start <= line:
                cell, first = number, start
        return cell, (line - first + 1 if cell is not None else line)


def _mask(source: str) -> str:
    """Each line IPython would rewrite becomes ``pass  # lintdist-magic: <line>`` at its indentation, its
    backslash-continued lines ``pass  # lintdist-continued: <line>``, so every line keeps its number.

    Like IPython's input transformer: a cell whose first non-blank line starts with ``%%`` is a cell magic
    (its body is the magic's input, not Python); otherwise an escape counts only where a logical line starts,
    not inside a string, brackets or a continued Python line."""
    lines = source.splitlines(keepends=True)
    first = next((line for line in lines if line.strip()), "")
    if first.startswith("%%"):
        return "".join(MAGIC + _body(line) + _ending(line) for line in lines)
    masked: list[str] = []
    scanner = _Scanner()
    continued_indent: str | None = None
    for line in lines:
        body, ending = _body(line), _ending(line)
        if continued_indent is not None:
            masked.append(continued_indent + CONTINUED + body + ending)
            if not body.endswith("\\"):
                continued_indent = None
            continue
        stripped = body.lstrip()
        indent = body[: len(body) - len(stripped)]
        if scanner.at_line_start and stripped and _ipython_line(stripped):
            masked.append(indent + MAGIC + stripped + ending)
            if stripped.endswith("\\"):
                continued_indent = indent
            continue
        scanner.feed(body)
        masked.append(line)
    return "".join(masked)


def _ipython_line(stripped: str) -> bool:
    if stripped.startswith(ESCAPES):
        return True
    if stripped.endswith("?") and HELP_END.match(stripped):
        return True
    return bool(ASSIGN_ESCAPE.match(stripped))


def _body(line: str) -> str:
    return line.rstrip("\r\n")


def _ending(line: str) -> str:
    return line[len(_body(line)) :]


class _Scanner:
    """Whether the next physical line starts a logical line: not inside brackets, a triple-quoted string or
    after a backslash continuation. A small scan over Python's lexical rules (comments, strings, brackets)."""

    def __init__(self) -> None:
        self.depth = 0
        self.quote: str | None = None  # the open triple quote
        self.backslash = False

    @property
    def at_line_start(self) -> bool:
        return self.depth == 0 and self.quote is None and not self.backslash

    def feed(self, body: str) -> None:
        self.backslash = False
        i, n = 0, len(body)
        while i < n:
            if self.quote is not None:
                end = body.find(self.quote, i)
                while end > 0 and _escaped(body, end):
                    end = body.find(self.quote, end + 1)
                if end < 0:
                    return
                i, self.quote = end + 3, None
                continue
            char = body[i]
            if char == "#":
                return
            if char in "'\"":
                if body.startswith(char * 3, i):
                    self.quote = char * 3
                    i += 3
                    continue
                end = i + 1
                while end < n and (body[end] != char or _escaped(body, end)):
                    end += 1
                i = end + 1
                continue
            if char in "([{":
                self.depth += 1
            elif char in ")]}":
                self.depth = max(self.depth - 1, 0)
            i += 1
        self.backslash = body.endswith("\\") and self.quote is None


def _escaped(text: str, index: int) -> bool:
    count = 0
    while index - count - 1 >= 0 and text[index - count - 1] == "\\":
        count += 1
    return count % 2 == 1


def read_notebook(text: str) -> Notebook:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise SourceError("LD001", f"invalid notebook JSON: {error.msg}", error.lineno, error.colno) from error
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise SourceError("LD001", "not a Jupyter notebook (no `cells` list)")
    language = (data.get("metadata", {}).get("language_info") or {}).get("name", "python")
    if language != "python":
        raise SourceError("LD001", f"not a Python notebook (language {language!r})")
    parts, starts, trailing = [], [], {}
    line = 1
    for index, cell in enumerate(data["cells"]):
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else source
        trailing[index] = source.endswith("\n")
        code = _mask(source) + ("" if trailing[index] or not source else "\n")
        parts.append(f"{CELL_MARKER}{index + 1}\n{code}")
        starts.append((line + 1, index + 1))
        line += 1 + code.count("\n")
    return Notebook(data, "".join(parts), starts, trailing, text.endswith("\n"))


def write_notebook(notebook: Notebook, python: str) -> str:
    """The notebook's JSON with its code cells replaced by the (fixed) Python text."""
    sources: dict[int, list[str]] = {}
    preamble: list[str] = []
    current: list[str] = preamble
    for line in python.splitlines(keepends=True):
        if line.startswith(CELL_MARKER):
            current = sources.setdefault(int(line[len(CELL_MARKER) :].strip()) - 1, [])
            continue
        body = line.rstrip("\r\n")
        if (match := MAGIC_LINE.match(body)) is not None:
            line = match.group(1) + match.group(2) + line[len(body) :]
        elif (match := CONTINUED_LINE.match(body)) is not None:
            line = match.group(1) + line[len(body) :]
        current.append(line)
    if preamble and sources:
        first = min(sources)
        sources[first] = preamble + sources[first]
    data = notebook.data
    for index, lines in sources.items():
        text = "".join(lines)
        if not notebook.trailing_newline.get(index, True) and text.endswith("\n"):
            text = text[:-1]
        cell = data["cells"][index]
        original = cell.get("source", "")
        if text != ("".join(original) if isinstance(original, list) else original):
            # nbformat allows a string or a list of lines: keep the form the notebook used
            cell["source"] = text if isinstance(original, str) else text.splitlines(keepends=True)
    return json.dumps(data, indent=1, ensure_ascii=False) + ("\n" if notebook.final_newline else "")
