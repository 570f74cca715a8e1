"""The values that flow between the engine, the rules and the reporters."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import libcst as cst


class Severity(str, enum.Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


class Applicability(str, enum.Enum):
    SAFE = "safe"
    UNSAFE = "unsafe"


@dataclass(frozen=True)
class TextEdit:
    """Replace the characters [start, end) of a file's text (offsets into the decoded text)."""

    start: int
    end: int
    replacement: str


@dataclass(frozen=True)
class Fix:
    """A change that removes a finding.

    Python fixes replace libcst nodes (``replacements``, keyed by the original
    node) and may ask for imports (``imports``: ``(module, name)`` pairs, added
    once with libcst's ``AddImportsVisitor``). ``stale_imports`` names imports the
    change may leave unused (``(module, name)``, or ``(module, None)`` for
    ``import module``): each is removed if nothing reads it any more. Configuration and launch files
    are fixed with ``edits`` on their text.
    """

    applicability: Applicability
    message: str
    replacements: tuple[tuple[cst.CSTNode, cst.CSTNode | cst.RemovalSentinel | cst.FlattenSentinel], ...] = ()
    imports: tuple[tuple[str, str], ...] = ()
    edits: tuple[TextEdit, ...] = ()
    stale_imports: tuple[tuple[str, str | None], ...] = ()


@dataclass(frozen=True)
class Span:
    """1-based lines and 1-based columns; the end column is exclusive."""

    line: int
    column: int
    end_line: int
    end_column: int


@dataclass(frozen=True)
class Finding:
    code: str
    name: str
    severity: Severity
    message: str
    filename: str
    span: Span
    fix: Fix | None = field(default=None, compare=False)
    fix_applicability: Applicability | None = None
    fix_message: str | None = None
    url: str | None = None
    # The fix as text replacements, filled in only for reporters that show them (SARIF).
    edits: tuple[TextEdit, ...] = field(default=(), compare=False)
    # For notebooks: the cell (1-based, as Jupyter numbers them); lines are then lines of that cell.
    cell: int | None = None

    @property
    def location(self) -> str:
        cell = f"cell {self.cell}:" if self.cell is not None else ""
        return f"{self.filename}:{cell}{self.span.line}:{self.span.column}"

    @property
    def sort_key(self) -> tuple:
        return (self.filename, self.cell or 0, self.span.line, self.span.column, self.code, self.message)

    def to_json(self, *, with_edits: bool = False) -> dict:
        data = {
            "code": self.code,
            "name": self.name,
            "severity": self.severity.value,
            "message": self.message,
            "filename": self.filename,
            "line": self.span.line,
            "column": self.span.column,
            "end_line": self.span.end_line,
            "end_column": self.span.end_column,
            "fix": None
            if self.fix_applicability is None
            else {"applicability": self.fix_applicability.value, "message": self.fix_message},
            "url": self.url,
        }
        if self.cell is not None:
            data["cell"] = self.cell
        if with_edits:
            data["edits"] = [[e.start, e.end, e.replacement] for e in self.edits]
        return data

    @classmethod
    def from_json(cls, data: dict) -> Finding:
        fix = data.get("fix")
        return cls(
            code=data["code"],
            name=data["name"],
            severity=Severity(data["severity"]),
            message=data["message"],
            filename=data["filename"],
            span=Span(data["line"], data["column"], data["end_line"], data["end_column"]),
            fix_applicability=None if fix is None else Applicability(fix["applicability"]),
            fix_message=None if fix is None else fix["message"],
            url=data.get("url"),
            edits=tuple(TextEdit(*e) for e in data.get("edits", ())),
            cell=data.get("cell"),
        )
