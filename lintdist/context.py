"""Everything a rule can see about one checked file."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.model import Finding, Span

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts
    from lintdist.launch import LaunchSettings
    from lintdist.names import NameResolver
    from lintdist.sources import ConfigDocument, LaunchFile
    from lintdist.syntax import SyntaxIndex


@dataclass
class FileContext:
    path: Path
    display_name: str
    text: str
    kind: str  # "python", "config" or "launch"
    options: dict[str, Any] = field(default_factory=dict)
    module: cst.Module | None = None
    index: SyntaxIndex | None = None
    names: NameResolver | None = None
    facts: PythonFacts | None = None
    config: ConfigDocument | None = None
    launch: LaunchFile | None = None
    # Launch settings in force for this script, gathered by the project pass.
    settings: LaunchSettings | None = None
    findings: list[Finding] = field(default_factory=list)
    # The project's other files the check read (their changes must re-check this file).
    dependencies: list[Path] = field(default_factory=list)
    # A documentation page's program: the (first, last) lines of each of its code blocks, the parts a reader copies.
    blocks: tuple[tuple[int, int], ...] = ()
    _positions: Any = None

    def add(self, finding: Finding) -> None:
        self.findings.append(finding)

    @property
    def is_test_module(self) -> bool:
        """A test module: under a ``tests``/``test`` folder, or named ``test_*.py``, ``*_test.py``, ``conftest.py``.
        Tests build wrappers and pick devices on purpose, on one node, to exercise code."""
        parts = [part.lower() for part in self.path.parts]
        name = parts[-1] if parts else ""
        return (
            any(part in {"tests", "test"} for part in parts[:-1])
            or name.startswith("test_")
            or name.endswith("_test.py")
            or name == "conftest.py"
        )

    @property
    def is_documentation(self) -> bool:
        """A page of documentation (Markdown, MDX, reStructuredText): its commands are examples a reader adapts,
        and a literal address or path in them stands for the reader's own."""
        return self.path.suffix.lower() in {".md", ".mdx", ".rst"}

    def runtime_name_free(self, name: str) -> bool:
        """A fix may import ``name`` from ``lintdist.runtime``: no other module-level ``name`` is in the way."""
        return all(
            isinstance(b.node, cst.ImportFrom) and get_full_name_for_node(b.node.module) == "lintdist.runtime"
            for b in self.names.module_bindings(name)
        )

    def block_of(self, node: cst.CSTNode) -> int:
        """The number of the documentation block ``node`` starts in (-1 outside every block)."""
        line = self.span(node).line
        return next((number for number, (first, last) in enumerate(self.blocks) if first <= line <= last), -1)

    def span(self, node: cst.CSTNode) -> Span:
        """Where ``node`` is. Positions take a printing pass over the module, paid only by a file with a finding."""
        assert self.module is not None, "span() of a node needs a parsed Python file"
        if self.facts is not None:  # a stand-in for a value made in another module is placed where it stands
            node = self.facts.stand_ins.get(id(node), node)
        if self._positions is None:
            from lintdist.positions import Positions

            self._positions = Positions(self.module, self.text, self.index.parent)
        line, column, end_line, end_column = self._positions.range(node)
        return Span(line, column + 1, end_line, end_column + 1)
