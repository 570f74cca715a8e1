"""The project's own modules: which file an import names, who calls a function from another module, and each
module's facts on demand, so that facts follow an object across calls, methods and modules.

A file is one module of a project: the files under its import root (the folder above its top package, or its
own folder for a script that is in no package, with ``src/`` layouts handled the same way). An import of the
project's own code resolves to a file by the rules Python itself applies (``pkg/mod.py``, ``pkg/mod/__init__.py``,
a namespace folder, relative imports); installed libraries stay names and are never parsed.

Nothing here is computed before a rule asks: a file whose rules never leave it pays nothing. A module another
file's question reaches is parsed once per process (the engine reuses that parse when the module is checked
itself), and every file read to answer a question is recorded, so the cache can re-check a file when one of
the files it read changes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import libcst as cst

from lintdist.modules import (
    MAX_PROJECT_FILES,
    absolute,
    import_root,
    imported_files,
    local_top_names,
    module_names,
    project_files,
    resolve_module,
    resolve_name,
)

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts

# How many ``from .x import name`` re-exports a definition is followed through.
MAX_REEXPORTS = 3
# How many checked modules' parses are kept for other modules' questions.
MAX_ADOPTED = 4


@dataclass(frozen=True)
class Site:
    """A call of a function of one module, in another module: the caller's facts and the call."""

    facts: PythonFacts
    call: cst.Call
    path: Path


class Project:
    """The modules of the checked tree, analysed on demand, once per process."""

    def __init__(self) -> None:
        self._analysed: dict[Path, PythonFacts | None] = {}
        self._texts: dict[Path, str] = {}
        self._adopted: dict[Path, tuple[str, PythonFacts]] = {}
        self._callers: dict[tuple[Path, str], list[Site]] = {}
        self._mentions: dict[tuple[Path, str], list[Path]] = {}
        self._recorders: list[set[Path]] = []
        self._reverse: dict[Path, dict[Path, list[Path]]] = {}
        # unsaved editor texts by path (the language server's open documents)
        self.overlay: dict[Path, str] = {}

    # -- files --------------------------------------------------------------------------------

    @contextmanager
    def recording(self) -> Iterator[set[Path]]:
        """Collect the project files read inside the block (nested blocks add to the outer ones)."""
        read: set[Path] = set()
        self._recorders.append(read)
        try:
            yield read
        finally:
            self._recorders.pop()
            if self._recorders:
                self._recorders[-1].update(read)

    def record(self, paths: Iterable[Path]) -> None:
        """Count files as read by the check under way (an answer remembered from an earlier question)."""
        if self._recorders:
            self._recorders[-1].update(paths)

    def text(self, path: Path) -> str | None:
        if self._recorders:
            self._recorders[-1].add(path)
        return self._read(path)

    def _read(self, path: Path) -> str | None:
        """A file's text, not counted as read by the check under way (a scan for a name); an editor's unsaved
        text where the language server holds one."""
        if path in self.overlay:
            return self.overlay[path]
        if path not in self._texts:
            from lintdist.sources import SourceError, decode_source

            self._texts[path] = None
            try:
                data = path.read_bytes()
                self._texts[path] = decode_source(data, "python").text
            except (OSError, SourceError):  # unreadable or undecodable: not a module lintdist can follow
                return None
        return self._texts[path]

    def adopt(self, path: Path, text: str, facts: PythonFacts) -> None:
        """The engine parsed this module to check it: a question from another module reuses that parse when
        the file on disk holds the same text. Only the last few are kept: a parsed module is large, and every
        one kept alive makes the garbage collector's passes longer (files of one package are checked one
        after the other, so their questions find each other here)."""
        self._adopted[path.resolve()] = (text, facts)
        while len(self._adopted) > MAX_ADOPTED:
            del self._adopted[next(iter(self._adopted))]

    def parsed(self, path: Path, text: str) -> PythonFacts | None:
        """The facts of a module already parsed in this process from exactly ``text``, if any."""
        path = path.resolve()
        facts = self._analysed.get(path)
        return facts if facts is not None and self._texts.get(path) == text else None

    def forget(self, path: Path) -> None:
        """A fix rewrote the file: the next question reads it again."""
        path = path.resolve()
        for table in (self._analysed, self._texts, self._adopted):
            table.pop(path, None)
        self._callers.clear()
        self._reverse.clear()

    def facts(self, path: Path) -> PythonFacts | None:
        """The facts of a project module, parsed on first use (None: unreadable or not Python)."""
        if self._recorders:
            self._recorders[-1].add(path)
        if path not in self._analysed:
            self._analysed[path] = None
            text = self.text(path)
            if text is None:
                return None
            adopted = self._adopted.get(path)
            if adopted is not None and adopted[0] == text:
                self._analysed[path] = adopted[1]
                return adopted[1]
            from lintdist.facts import PythonFacts
            from lintdist.names import NameResolver
            from lintdist.syntax import SyntaxIndex

            try:
                module = cst.parse_module(text)
            except (cst.ParserSyntaxError, RecursionError):
                return None
            index = SyntaxIndex(module)
            facts = PythonFacts(index, NameResolver(index))
            facts.project = ProjectView(self, path, text)
            self._analysed[path] = facts
        return self._analysed[path]

    # -- questions ----------------------------------------------------------------------------

    def definition(self, qualified: str, importer: Path, depth: int = 0) -> tuple[PythonFacts, cst.CSTNode] | None:
        """The module-level function, class or assignment a qualified name read in ``importer`` names, followed
        through re-exports (``from .trainer import Trainer`` in a package's ``__init__.py``)."""
        found = resolve_name(qualified, importer)
        if found is None:
            return None
        path, rest = found
        if path == importer.resolve() or "." in rest:
            return None
        facts = self.facts(path)
        if facts is None:
            return None
        node = facts.module_definition(rest)
        if node is not None:
            return facts, node
        if depth >= MAX_REEXPORTS:
            return None
        for binding in facts.names.module_bindings(rest):
            if isinstance(binding.node, (cst.Import, cst.ImportFrom)):
                for name in binding.qualified_names(rest):
                    target = self.definition(absolute(name, path), path, depth + 1)
                    if target is not None:
                        return target
        return None

    def callers(self, path: Path, name: str) -> list[Site]:
        key = (path.resolve(), name)
        if key not in self._callers:
            self._mentions[key] = []
            self._callers[key] = list(self._find_callers(*key))
        self.record(self._mentions[key])
        return self._callers[key]

    def mentions(self, path: Path, name: str) -> list[Path]:
        """The files read while looking for callers of ``name`` (a change to any can change the answer)."""
        return self._mentions.get((path.resolve(), name), [])

    def _find_callers(self, path: Path, name: str) -> Iterator[Site]:
        """Calls of the module-level ``name`` of ``path`` (a function, or a class: its construction) in the
        other files of its project; ``Cls.method`` names a method called on an instance built there."""
        path = path.resolve()
        owner, _, method = name.rpartition(".")
        targets = {f"{module}.{owner or name}" for module in module_names(path)}
        called = method if owner else name
        word = _word(called)
        for other in self._importers(path):
            if not word.search(self._read(other)):
                continue
            self._mentions[(path, name)].append(other)
            facts = self.facts(other)
            if facts is None:
                continue
            for call in facts.calls:
                if facts.method_name(call) != called:
                    continue
                if (
                    not owner
                    and any(self._names(q, other, targets, path) for q in facts.qualified_names(call.func))
                    or owner
                    and isinstance(call.func, cst.Attribute)
                    and _built_from(self, facts, call, targets, other, path)
                ):
                    yield Site(facts, call, other)

    def _importers(self, path: Path) -> list[Path]:
        """The project's other files that import ``path``: the module graph's reverse edges (built once per
        import root from each file's import lines), through a package ``__init__.py`` that re-exports it."""
        root = import_root(path)
        if root not in self._reverse:
            reverse: dict[Path, list[Path]] = {}
            for other in project_files(root):
                text = self._read(other)
                for target in imported_files(other, text) if text is not None else ():
                    reverse.setdefault(target, []).append(other)
            self._reverse[root] = reverse
        reverse = self._reverse[root]
        found: dict[Path, None] = {}
        pending = [path]
        while pending:
            current = pending.pop()
            for importer in reverse.get(current, ()):
                if importer != path and importer not in found:
                    found[importer] = None
                    if importer.name == "__init__.py" and len(found) < MAX_PROJECT_FILES:
                        pending.append(importer)
        return list(found)

    def _names(self, qualified: str, importer: Path, targets: set[str], path: Path) -> bool:
        """A qualified name read in ``importer`` is one of ``targets`` of ``path``, directly or re-exported."""
        name = absolute(qualified, importer)
        if name in targets:
            return True
        if name.rsplit(".", 1)[-1] not in {t.rsplit(".", 1)[-1] for t in targets}:
            return False
        found = self.definition(name, importer)
        return found is not None and found[0].project is not None and found[0].project.path == path

    def references(self, path: Path, name: str) -> list[tuple[PythonFacts, cst.Name, Path]]:
        key = (path.resolve(), f"{name} as a value")
        if key not in self._callers:
            found = list(self._find_references(path.resolve(), name))
            self._callers[key] = found
            self._mentions[key] = sorted({other for _, _, other in found})
        self.record(self._mentions[key])
        return self._callers[key]

    def _find_references(self, path: Path, name: str) -> Iterator[tuple[PythonFacts, cst.Name, Path]]:
        """Reads of the module-level ``name`` of ``path`` in other project files that are not calls (a function
        handed to ``mp.spawn`` or kept as a callback)."""
        path = path.resolve()
        targets = {f"{module}.{name}" for module in module_names(path)}
        word = _word(name)
        for other in self._importers(path):
            if not word.search(self._read(other)):
                continue
            facts = self.facts(other)
            if facts is None:
                continue
            for node in facts.index.nodes(cst.Name):
                if node.value != name or isinstance(facts.parent(node), (cst.ImportAlias, cst.Attribute)):
                    continue
                parent = facts.parent(node)
                if isinstance(parent, cst.Call) and parent.func is node:
                    continue
                if any(self._names(q, other, targets, path) for q in facts.qualified_names(node)):
                    yield facts, node, other


def _word(name: str) -> re.Pattern[str]:
    """``name`` as a whole identifier, literal first (the fast scan) and the boundaries checked around it."""
    return re.compile(rf"{re.escape(name)}(?<!\w{re.escape(name)})(?!\w)")


def _built_from(
    project: Project, facts: PythonFacts, call: cst.Call, classes: set[str], importer: Path, path: Path
) -> bool:
    """The receiver of ``x.method(...)`` is an instance of one of ``classes`` (qualified names of ``path``)."""
    for origin in facts.origins(call.func.value, call):
        node = origin.node
        if isinstance(node, cst.Call) and any(
            project._names(q, importer, classes, path) for q in facts.qualified_names(node.func)
        ):
            return True
    return False


class ProjectView:
    """One module's window on its project: what its facts ask when a question leaves the file."""

    def __init__(self, project: Project, path: Path, text: str | None = None) -> None:
        self.project = project
        self.path = path.resolve()
        self._text = text
        self._positions = None

    @property
    def text(self) -> str | None:
        return self._text if self._text is not None else self.project.text(self.path)

    def line(self, facts: PythonFacts, node: cst.CSTNode) -> int | None:
        """The 1-based line of a node of this module (positions are computed on the first question)."""
        if self._positions is None:
            from lintdist.positions import Positions

            text = self.text
            if text is None:
                return None
            self._positions = Positions(facts.index.module, text, facts.index.parent)
        try:
            return self._positions.range(node)[0]
        except (KeyError, ValueError):
            return None

    def definition(self, qualified: str) -> tuple[PythonFacts, cst.CSTNode] | None:
        head = qualified.split(".", 1)[0]
        if head and head not in local_top_names(self.path):
            return None  # an installed library's name (`torch.nn.Module`), or a name of this module
        return self.project.definition(qualified, self.path)

    def callers(self, name: str) -> list[Site]:
        return self.project.callers(self.path, name)

    def references(self, name: str) -> list[tuple[PythonFacts, cst.Name, Path]]:
        return self.project.references(self.path, name)


_PROCESS_PROJECT: Project | None = None


def process_project() -> Project:
    """The project of this process (a worker checks many files of one tree)."""
    global _PROCESS_PROJECT
    if _PROCESS_PROJECT is None:
        _PROCESS_PROJECT = Project()
    return _PROCESS_PROJECT


def reset_process_project() -> None:
    """Forget every parse and text (a new run, or files written by a fix)."""
    global _PROCESS_PROJECT
    _PROCESS_PROJECT = None
    for cached in (project_files, local_top_names, resolve_module, import_root, module_names):
        cached.cache_clear()
