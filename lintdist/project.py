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

import os
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import libcst as cst

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts

INSTALLED = frozenset({"site-packages", "dist-packages"})
# A project larger than this is searched no further for callers (the answer is then "unknown").
MAX_PROJECT_FILES = 4000
MAX_FOLDER_DEPTH = 6
MAX_REEXPORTS = 3
SKIPPED_FOLDERS = frozenset(
    {".git", ".hg", ".venv", "venv", "env", "node_modules", "__pycache__", "build", "dist", "site-packages"}
    | {".tox", ".nox", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".lintdist_cache", ".eggs"}
)


@dataclass(frozen=True)
class Site:
    """A call of a function of one module, in another module: the caller's facts and the call."""

    facts: PythonFacts
    call: cst.Call
    path: Path


def in_project(path: Path) -> bool:
    """A file on disk that is not an installed library's: its project's other modules can be followed."""
    return path.is_file() and not INSTALLED.intersection(path.resolve().parts)


@lru_cache(maxsize=4096)
def import_root(path: Path) -> Path:
    """The folder a module's absolute imports start from: above its top package (a folder with
    ``__init__.py``), or its own folder."""
    folder = path.parent
    while (folder / "__init__.py").is_file() and folder.parent != folder:
        folder = folder.parent
    return folder


@lru_cache(maxsize=4096)
def module_names(path: Path) -> tuple[str, ...]:
    """The dotted names the file is imported by: from its import root and, for a module in a package, also
    the bare name a script beside it uses (``import utils`` from ``train.py`` in the same folder)."""
    names = []
    for base in dict.fromkeys((import_root(path), path.parent)):
        try:
            parts = list(path.relative_to(base).with_suffix("").parts)
        except ValueError:
            continue
        if parts and parts[-1] == "__init__":
            parts.pop()
        if parts and all(part.isidentifier() for part in parts):
            names.append(".".join(parts))
    return tuple(names)


def absolute(name: str, importer: Path) -> str:
    """A qualified name as the resolver writes it, made absolute: ``..utils.save`` read in
    ``pkg/sub/train.py`` is ``pkg.utils.save``."""
    if not name.startswith("."):
        return name
    level = len(name) - len(name.lstrip("."))
    rest = name[level:]
    own = module_names(importer)
    package = own[0].split(".") if own else []
    if importer.name != "__init__.py":
        package = package[:-1]
    if level - 1 > len(package):
        return name
    base = package[: len(package) - (level - 1)]
    return ".".join([*base, rest] if rest else base)


@lru_cache(maxsize=16384)
def resolve_module(dotted: str, importer: Path) -> Path | None:
    """The project file a dotted module name names, seen from ``importer`` (None: not the project's)."""
    parts = dotted.split(".")
    bases = [import_root(importer), importer.parent]
    src = import_root(importer) / "src"
    if src.is_dir():
        bases.append(src)
    for base in dict.fromkeys(bases):
        target = base.joinpath(*parts)
        for candidate in (target.with_suffix(".py"), target / "__init__.py"):
            if candidate.is_file():
                return candidate.resolve()
    return None


def resolve_name(qualified: str, importer: Path) -> tuple[Path, str] | None:
    """``pkg.utils.save_checkpoint`` -> (the file of ``pkg.utils``, ``save_checkpoint``): the longest module
    prefix that is a project file, and the dotted rest."""
    parts = absolute(qualified, importer).split(".")
    for cut in range(len(parts) - 1, 0, -1):
        path = resolve_module(".".join(parts[:cut]), importer)
        if path is not None:
            return path, ".".join(parts[cut:])
    return None


@lru_cache(maxsize=4096)
def local_top_names(path: Path) -> frozenset[str]:
    """The names an absolute import from ``path`` can reach in the project: its import root's and its own
    folder's modules and packages (an import of anything else is an installed library's)."""
    names = set()
    bases = [import_root(path), path.parent]
    if (import_root(path) / "src").is_dir():
        bases.append(import_root(path) / "src")
    for base in dict.fromkeys(bases):
        try:
            for entry in os.scandir(base):
                if entry.name.endswith(".py"):
                    names.add(entry.name[:-3])
                elif entry.is_dir() and entry.name.isidentifier():
                    names.add(entry.name)
        except OSError:
            continue
    return frozenset(names)


@lru_cache(maxsize=256)
def project_files(root: Path) -> tuple[Path, ...]:
    """The Python files under an import root (bounded in depth and number)."""
    found: list[Path] = []
    pending = [(root, 0)]
    while pending and len(found) < MAX_PROJECT_FILES:
        folder, depth = pending.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if entry.name.startswith(".") or entry.name in SKIPPED_FOLDERS:
                continue
            if entry.is_dir(follow_symlinks=False):
                if depth < MAX_FOLDER_DEPTH:
                    pending.append((Path(entry.path), depth + 1))
            elif entry.name.endswith(".py"):
                found.append(Path(entry.path).resolve())
    return tuple(found)


class Project:
    """The modules of the checked tree, analysed on demand, once per process."""

    def __init__(self) -> None:
        self._analysed: dict[Path, PythonFacts | None] = {}
        self._texts: dict[Path, str] = {}
        self._adopted: dict[Path, tuple[str, PythonFacts]] = {}
        self._callers: dict[tuple[Path, str], list[Site]] = {}
        self._mentions: dict[tuple[Path, str], list[Path]] = {}
        self._recorders: list[set[Path]] = []
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
        the file on disk holds the same text."""
        self._adopted[path.resolve()] = (text, facts)

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

    def definition(
        self, qualified: str, importer: Path, depth: int = 0
    ) -> tuple[PythonFacts, cst.CSTNode] | None:
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
        word = re.compile(rf"\b{re.escape(called)}\b")
        for other in project_files(import_root(path)):
            if other == path:
                continue
            text = self._read(other)
            if text is None or not word.search(text) or not _may_import(text, path):
                continue
            self._mentions[(path, name)].append(other)
            facts = self.facts(other)
            if facts is None:
                continue
            for call in facts.calls:
                if facts.method_name(call) != called:
                    continue
                if not owner and any(self._names(q, other, targets, path) for q in facts.qualified_names(call.func)):
                    yield Site(facts, call, other)
                elif owner and isinstance(call.func, cst.Attribute) and _built_from(self, facts, call, targets, other, path):
                    yield Site(facts, call, other)

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
        word = re.compile(rf"\b{re.escape(name)}\b")
        for other in project_files(import_root(path)):
            if other == path:
                continue
            text = self._read(other)
            if text is None or not word.search(text) or not _may_import(text, path):
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


def _may_import(text: str, path: Path) -> bool:
    """A cheap test before parsing: the text names the module (``utils`` of ``utils.py``, the package of an
    ``__init__.py``) or imports relatively."""
    module = path.parent.name if path.name == "__init__.py" else path.stem
    return module in text or "from ." in text


def _built_from(project: Project, facts: PythonFacts, call: cst.Call, classes: set[str], importer: Path, path: Path) -> bool:
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
    project_files.cache_clear()
    local_top_names.cache_clear()
    resolve_module.cache_clear()
    import_root.cache_clear()
    module_names.cache_clear()
