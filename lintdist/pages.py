"""Code in documentation: the labelled blocks of Markdown, MDX and reStructuredText pages, and the examples in
Python docstrings, read as programs whose lines are the page's own lines.

A page's Python blocks form one program, in order, as a notebook's cells do: every line of the page is a line of
the program, blank outside the blocks, so that a finding's line is the page's line. Each block's code is
dedented (the fence's or directive's indentation, and ``>>> `` / ``... `` prompts, are removed) and its column
shift is kept per line, to place findings and to write fixes back. A block that does not parse alone is left
out, and so are its output lines (``pycon``) and templating lines (``{% ... %}``, ``{{ ... }}``). YAML blocks are
read one by one as config documents, shell blocks as launch text, each also line for line.

The way back (``write_back``) takes the fixed program and puts every changed line into its block, with the
block's indentation and prompts; it refuses (None) a change that falls outside a block.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

NEWLINE = re.compile(r"\r\n?|\n")
# Fenced blocks (Markdown, MDX): a fence of three or more backticks or tildes, at any indentation (lists, MDX
# components), and the first word of its info string.
FENCE = re.compile(r"^([ \t]*)(`{3,}|~{3,})[ \t]*\{?\.?([\w+-]*)")
PYTHON = frozenset({"python", "py", "python3", "py3", "pycon", "ipython"})
YAML = frozenset({"yaml", "yml"})
SHELL = frozenset({"bash", "sh", "shell", "console", "zsh"})
# reStructuredText: a code directive and its language; `::` at the end of a paragraph opens a literal block.
DIRECTIVE = re.compile(r"^([ \t]*)\.\.[ \t]+(?:code-block|code|sourcecode|testcode|doctest)::[ \t]*([\w+-]*)")
LITERAL = re.compile(r"::[ \t]*$")
DIRECTIVE_OPTION = re.compile(r"^[ \t]+:[\w-]+:")
TEMPLATE = re.compile(r"^[ \t]*(\{%|\{\{|\{#)")
PROMPT = re.compile(r"^([ \t]*)(>>>|\.\.\.)( |$)")


@dataclass
class Block:
    """One code block of a page: its language, and for each of its lines the page line (0-based), the
    characters removed before the code (indentation, prompt) and the code."""

    language: str  # "python", "yaml" or "shell"
    lines: list[int] = field(default_factory=list)
    prefixes: list[str] = field(default_factory=list)
    code: list[str] = field(default_factory=list)
    pycon: bool = False
    _parses: bool | None = None

    @property
    def indent(self) -> str:
        """The indentation of the block's code (before any prompt)."""
        prefix = next((p for p, code in zip(self.prefixes, self.code) if code), "")
        return prefix[: len(prefix) - len(prefix.lstrip(" \t"))]

    @property
    def text(self) -> str:
        return "\n".join(self.code) + "\n"

    def parses(self) -> bool:
        """The block is Python that parses on its own (checked once)."""
        if self._parses is None:
            import libcst as cst

            try:
                cst.parse_module(self.text)
                self._parses = True
            except (cst.ParserSyntaxError, RecursionError, MemoryError, ValueError):
                self._parses = False
        return self._parses

    @property
    def first(self) -> int:
        return self.lines[0] if self.lines else -1

    @property
    def last(self) -> int:
        return self.lines[-1] if self.lines else -1


@dataclass
class Page:
    """A page's lines (without their endings), their endings, and its code blocks in order."""

    lines: list[str]
    endings: list[str]
    blocks: list[Block]
    _shifts: dict[int, int] | None = None

    def python(self) -> str:
        """The page's program: the code of its Python blocks that parse alone (``python_blocks``)."""
        return self.program(self.python_blocks())

    def python_blocks(self) -> list[Block]:
        return [block for block in self.blocks if block.language == "python" and block.parses()]

    def program(self, blocks: list[Block]) -> str:
        """The code of these blocks at their lines, blank lines elsewhere: line for line the page's."""
        out = [""] * len(self.lines)
        for block in blocks:
            for line, code in zip(block.lines, block.code):
                out[line] = code
        return "\n".join(out) + "\n"

    def in_place(self, blocks: list[Block]) -> str:
        """The page's text with everything but the code of these blocks turned into spaces: every offset, line and
        column stays the page's (a launch file's reading needs no moving back)."""
        code = {
            line: (prefix, text)
            for block in blocks
            for line, prefix, text in zip(block.lines, block.prefixes, block.code)
        }
        out = []
        for number, (line, ending) in enumerate(zip(self.lines, self.endings)):
            prefix, text = code.get(number, (line, ""))
            out.append(" " * len(prefix) + text + " " * (len(line) - len(prefix) - len(text)) + ending)
        return "".join(out)

    def shift(self, line: int) -> int:
        """How many characters precede the code on a 1-based page line (indentation, prompt)."""
        if self._shifts is None:
            self._shifts = {
                line: len(prefix) for block in self.blocks for line, prefix in zip(block.lines, block.prefixes)
            }
        return self._shifts.get(line - 1, 0)


def split_lines(text: str) -> tuple[list[str], list[str]]:
    """A text's lines and the ending of each (the last may have none)."""
    lines, endings, at = [], [], 0
    for match in NEWLINE.finditer(text):
        lines.append(text[at : match.start()])
        endings.append(match.group())
        at = match.end()
    if at < len(text) or not lines:
        lines.append(text[at:])
        endings.append("")
    return lines, endings


def language_of(label: str) -> str | None:
    label = label.lower()
    if label in PYTHON:
        return "python"
    if label in YAML:
        return "yaml"
    if label in SHELL:
        return "shell"
    return None


def read_page(text: str, suffix: str) -> Page:
    """The code blocks of a Markdown/MDX (``.md``, ``.mdx``) or reStructuredText (``.rst``) page."""
    lines, endings = split_lines(text)
    blocks = _rst_blocks(lines) if suffix.lower() == ".rst" else _fenced_blocks(lines, range(len(lines)))
    return Page(lines, endings, [_relabelled(_finished(block)) for block in blocks])


def read_docstrings(text: str) -> Page:
    """The examples in a Python file's docstrings: their fenced blocks and ``>>>`` sessions."""
    import ast

    lines, endings = split_lines(text)
    blocks: list[Block] = []
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return Page(lines, endings, [])
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                span = range(first.lineno - 1, first.end_lineno)
                fenced = _fenced_blocks(lines, span)
                inside = {line for block in fenced for line in range(block.first, block.last + 1)}
                blocks += fenced + _sessions(lines, [line for line in span if line not in inside])
    blocks.sort(key=lambda block: block.first)
    return Page(lines, endings, [_finished(block) for block in blocks if block.lines])


def _fenced_blocks(lines: list[str], span: range) -> list[Block]:
    blocks: list[Block] = []
    fence: str | None = None
    indent = 0
    block: Block | None = None
    for number in span:
        line = lines[number]
        if fence is None:
            opening = FENCE.match(line)
            if opening:
                fence, indent = opening[2], len(opening[1])
                language = language_of(opening[3])
                block = Block(language) if language else None
            continue
        stripped = line.strip()
        if stripped.startswith(fence) and not stripped.strip(fence[0]):
            if block is not None:
                blocks.append(block)
            fence, block = None, None
            continue
        if block is not None:
            cut = len(line) - len(line.lstrip(" \t")) if not line[:indent].strip() else 0
            cut = min(cut, indent)
            block.lines.append(number)
            block.prefixes.append(line[:cut])
            block.code.append(line[cut:])
    return blocks


def _rst_blocks(lines: list[str]) -> list[Block]:
    blocks: list[Block] = []
    number = 0
    while number < len(lines):
        line = lines[number]
        directive = DIRECTIVE.match(line)
        language = None
        if directive:
            language = language_of(directive[2] or "python")
        elif LITERAL.search(line) and not line.lstrip().startswith(".."):
            language = "python"  # Sphinx highlights a literal block as Python by default
        else:
            number += 1
            continue
        outer = len(line) - len(line.lstrip(" \t"))
        number += 1
        while number < len(lines) and DIRECTIVE_OPTION.match(lines[number]) and directive:
            number += 1
        body: list[int] = []
        while number < len(lines):
            text = lines[number]
            if text.strip() and len(text) - len(text.lstrip(" \t")) <= outer:
                break
            body.append(number)
            number += 1
        while body and not lines[body[-1]].strip():
            body.pop()
        while body and not lines[body[0]].strip():
            body.pop(0)
        if language is None or not body:
            continue
        indent = min(len(lines[n]) - len(lines[n].lstrip(" \t")) for n in body if lines[n].strip())
        block = Block(language)
        for n in body:
            block.lines.append(n)
            block.prefixes.append(lines[n][:indent] if lines[n].strip() else lines[n])
            block.code.append(lines[n][indent:] if lines[n].strip() else "")
        blocks.append(block)
    return blocks


def _sessions(lines: list[str], numbers: list[int]) -> list[Block]:
    """``>>>`` sessions among these lines (a docstring's text outside its fences): each a pycon block."""
    blocks: list[Block] = []
    block: Block | None = None
    previous = -2
    for number in numbers:
        prompt = PROMPT.match(lines[number])
        starts = prompt is not None and prompt[2] == ">>>"
        if block is not None and (number != previous + 1 or not lines[number].strip()):
            blocks.append(block)
            block = None
        if block is None and starts:
            block = Block("python")
        if block is not None:  # indentation off; `_finished` takes the prompts and blanks the output
            line = lines[number]
            cut = len(line) - len(line.lstrip(" \t"))
            block.lines.append(number)
            block.prefixes.append(lines[number][:cut])
            block.code.append(lines[number][cut:])
        previous = number
    if block is not None:
        blocks.append(block)
    return blocks


def _finished(block: Block) -> Block:
    """Prompts stripped (``pycon``: output lines blanked) and templating lines blanked; a block whose first
    code line has a ``>>>`` prompt is a session."""
    first = next((code for code in block.code if code.strip()), "")
    prompted = PROMPT.match(first)
    if block.language == "python" and prompted is not None and prompted[2] == ">>>":
        block.pycon = True
        for index, code in enumerate(block.code):
            prompt = PROMPT.match(code)
            if prompt is None:
                block.prefixes[index] += code
                block.code[index] = ""  # output
            else:
                block.prefixes[index] += code[: prompt.end()]
                block.code[index] = code[prompt.end() :]
    for index, code in enumerate(block.code):
        if TEMPLATE.match(code):
            block.prefixes[index] += code
            block.code[index] = ""
    return block


def _relabelled(block: Block) -> Block:
    """A block labelled Python that is a launch command (``torchrun --nproc_per_node=8 train.py`` under
    ``.. code-block:: python``) is read as shell, and one labelled shell that is an accelerate or DeepSpeed config
    (``distributed_type: FSDP`` under a ``shell`` fence) as YAML."""
    from lintdist.sources import CONFIG_MARKERS, LAUNCHERS, SourceError, parse_config

    if block.language == "python" and not block.pycon and LAUNCHERS.search(block.text) and not block.parses():
        block.language = "shell"
    elif block.language == "shell" and CONFIG_MARKERS.search(block.text) and not LAUNCHERS.search(block.text):
        try:
            if parse_config(block.text) is not None:
                block.language = "yaml"
        except SourceError:
            pass
    return block


def write_back(page: Page, blocks: list[Block], fixed: str) -> str | None:
    """The page with the fixed program of ``blocks`` put back into them; None where a change falls outside
    the blocks (a fix that needs a line the page does not show as code), or where it would add or remove lines
    of a ``>>>`` session."""
    import difflib

    old, new = page.program(blocks).split("\n")[:-1], fixed.split("\n")
    if new and new[-1] == "":
        new.pop()
    owner: dict[int, Block] = {}
    for block in blocks:
        owner.update(dict.fromkeys(block.lines, block))
    replaced: dict[int, list[str]] = {}  # page line -> the page lines that take its place
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        lines = range(i1, i2) if i1 < i2 else range(i1 - 1, i1)  # an insertion joins the line before it
        owners = {id(owner.get(line)) for line in lines}
        block = owner.get(lines[0])
        if block is None or len(owners) != 1:
            return None
        codes = new[j1:j2] if i1 < i2 else [old[i1 - 1], *new[j1:j2]]
        if block.pycon and (len(codes) != len(lines) or not all(old[line] for line in lines)):
            return None
        placed = [_placed(page, block, line, code) for line, code in zip(lines, codes)]
        placed += [_placed(page, block, None, code) for code in codes[len(lines) :]]
        for line in lines:
            replaced[line] = []
        replaced[lines[0]] = placed  # in order, in the place of the lines they replace
    out: list[str] = []
    for number, (line, ending) in enumerate(zip(page.lines, page.endings)):
        pieces = replaced.get(number)
        if pieces is None:
            out.append(line + ending)
            continue
        between = ending or _common_ending(page)
        for position, piece in enumerate(pieces):
            out.append(piece + (ending if position == len(pieces) - 1 else between))
    return "".join(out)


def _placed(page: Page, block: Block, line: int | None, code: str) -> str:
    """A page line holding ``code``: in place of the block's ``line`` (its own indentation and prompt), or new
    (the block's indentation)."""
    index = block.lines.index(line) if line is not None else -1
    if index >= 0 and code == block.code[index]:
        return page.lines[line]
    if index >= 0 and block.code[index]:
        prefix = block.prefixes[index]
    else:
        prefix = block.indent
    return prefix + code if code else prefix.rstrip()


def _common_ending(page: Page) -> str:
    endings = [ending for ending in page.endings if ending]
    return max(set(endings), key=endings.count) if endings else "\n"
