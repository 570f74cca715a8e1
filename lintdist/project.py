"""The questions that leave a file: who calls a function from another module, what another module's name is,
and each module's facts on demand, so that facts follow an object across calls, methods and modules (the
module graph itself, paths and import lines, is ``lintdist.modules``).

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
from libcst.helpers import get_full_name_for_node

from lintdist.modules import (
    MAX_REEXPORTS,
    absolute,
    clear_caches,
    defining_module,
    import_root,
    imported_files,
    local_top_names,
    module_names,
    project_files,
    project_too_large,
    resolve_name,
    top_package,
)

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts

# How many checked modules' parses are kept for other modules' questions.
MAX_ADOPTED = 4
# A function called from more files than this (a library's helper) is not followed into its callers, nor is
# one of a module that more files than MAX_SEARCHED_FILES may import (a large library's package).
MAX_CALLER_FILES = 8
MAX_SEARCHED_FILES = 256


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
        self._too_many: set[tuple[Path, str]] = set()
        self._recorders: list[set[Path]] = []
        self._exporters_of: dict[Path, frozenset[Path]] = {}
        self._imports: dict[Path, frozenset[Path]] = {}
        self._mentioning: dict[tuple, list[Path]] = {}
        self._by_folder: dict[Path, dict[Path, list[Path]]] = {}
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
        self._exporters_of.clear()
        self._imports.pop(path, None)
        self._mentioning.clear()

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

    def callers(self, path: Path, name: str, markers: tuple[str, ...] = ()) -> list[Site]:
        """The calls of ``name`` of ``path`` in other files; with ``markers``, only in files whose text holds
        one of them (a file that makes no Accelerator, model wrapper or loader passes none it made)."""
        key = (path.resolve(), name, markers)
        if key not in self._callers:
            self._mentions[key] = []
            self._callers[key] = []  # a question that comes back to this one while it is answered finds none
            self._callers[key] = list(self._find_callers(*key))
        self.record(self._mentions[key])
        return self._callers[key]

    def too_many_callers(self, path: Path, name: str) -> bool:
        """More files call ``name`` than a question follows (``MAX_CALLER_FILES``)."""
        return (path.resolve(), name) in self._too_many

    def _find_callers(self, path: Path, name: str, markers: tuple[str, ...] = ()) -> Iterator[Site]:
        """Calls of the module-level ``name`` of ``path`` (a function, or a class: its construction) in the
        other files of its project; ``Cls.method`` names a method called on an instance built there."""
        path = path.resolve()
        owner, _, method = name.rpartition(".")
        targets = {f"{module}.{owner or name}" for module in module_names(path)}
        called = method if owner else name
        candidates = self._importing(path, _call(called))
        if candidates is not None and markers:
            candidates = [other for other in candidates if any(m in self._read(other) for m in markers)]
        self._mentions[(path, name, markers)].extend(candidates or ())
        if candidates is None or len(candidates) > MAX_CALLER_FILES:
            self._too_many.add((path, name))  # a library's helper called all over: not followed
            return
        for other in candidates:
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

    def _importing(self, path: Path, word: re.Pattern[str]) -> list[Path] | None:
        """The project's other files whose text matches ``word`` (a call of the function, or the function
        handed on as a value) and that import ``path``, directly or through a package ``__init__.py`` that
        re-exports it; import lines are read only for those files and the package's ``__init__.py`` files.
        None when more files than ``MAX_SEARCHED_FILES`` may import it (a large library's module)."""
        candidates = self._may_import(path)
        if candidates is None or len(candidates) > MAX_SEARCHED_FILES:
            return None
        exporters = self._exporters(path)
        return [
            other
            for other in candidates
            if not exporters.isdisjoint(self._imports_of(other)) and word.search(self._read(other))
        ]

    def _exporters(self, path: Path) -> frozenset[Path]:
        """``path`` and the package ``__init__.py`` files that import it, directly or through one another."""
        if path not in self._exporters_of:
            found = {path}
            inits = [other for other in self._may_import(path) or () if other.name == "__init__.py"]
            grown = True
            while grown:
                grown = False
                for init in inits:
                    if init not in found and not found.isdisjoint(self._imports_of(init)):
                        found.add(init)
                        grown = True
            self._exporters_of[path] = frozenset(found)
        return self._exporters_of[path]

    def _may_import(self, target: Path) -> list[Path] | None:
        """The files that may import ``target``: under its import root, those whose text names its top package
        (the module itself, for a script in no package) or that sit in its package and import relatively; and,
        since a script runs with its own folder on ``sys.path``, the files directly in each folder between
        whose text names the rest of the path (``utils`` for ``pkg/utils/data.py`` read from ``pkg/train.py``).
        One substring scan of the project per package, shared by every module of it. None when the project is
        too large to search (``project_too_large``): nothing is read then."""
        root, package = import_root(target), top_package(target)
        if project_too_large(root):
            return None
        word = package.name if package is not None else target.stem
        key = (root, word, package)
        if key not in self._mentioning:
            found = []
            for other in project_files(root):
                text = self._read(other)
                if text is None:
                    continue
                if word in text or (package is not None and "from ." in text and package in other.parents):
                    found.append(other)
            self._mentioning[key] = found
        found = dict.fromkeys(self._mentioning[key])
        folder = target.parent
        while folder != root and root in folder.parents:
            first = target.relative_to(folder).parts[0].removesuffix(".py")
            for other in self._beside(root).get(folder, ()):
                if other not in found and first in (self._read(other) or ""):
                    found[other] = None
            folder = folder.parent
        return [other for other in found if other != target]

    def _beside(self, root: Path) -> dict[Path, list[Path]]:
        """The project's files by folder."""
        if root not in self._by_folder:
            by_folder: dict[Path, list[Path]] = {}
            for other in project_files(root):
                by_folder.setdefault(other.parent, []).append(other)
            self._by_folder[root] = by_folder
        return self._by_folder[root]

    def _imports_of(self, path: Path) -> frozenset[Path]:
        if path not in self._imports:
            text = self._read(path)
            self._imports[path] = frozenset(imported_files(path, text)) if text is not None else frozenset()
        return self._imports[path]

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
        candidates = self._importing(path, _argument(name))
        if candidates is None or len(candidates) > MAX_CALLER_FILES:
            self._too_many.add((path, name))  # unknown: the function may be handed on where no search looked
            return
        for other in candidates:
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


def _built_from(
    project: Project, facts: PythonFacts, call: cst.Call, classes: set[str], importer: Path, path: Path
) -> bool:
    """The receiver of ``x.method(...)`` is an instance of one of ``classes`` (qualified names of ``path``): the
    receiver's own assignments are read (``trainer = Trainer(...)``, ``self.trainer = Trainer(...)``), not
    followed further, so that looking for callers never asks for callers again."""
    key = get_full_name_for_node(call.func.value)
    for binding in facts.bindings(key, call) if key else ():
        value = binding.value
        if (
            binding.index is None
            and isinstance(value, cst.Call)
            and any(project._names(q, importer, classes, path) for q in facts.qualified_names(value.func))
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

    def of_project(self, qualified: str) -> bool:
        """A qualified name read in this module can name something of the project (not ``torch.nn.Module``)."""
        head = qualified.split(".", 1)[0]
        return not head or head in local_top_names(self.path)

    def definition(
        self, qualified: str, markers: tuple[str, ...] = (), pattern: re.Pattern[str] | None = None
    ) -> tuple[PythonFacts, cst.CSTNode] | None:
        """What ``qualified`` names in another module of the project. With ``markers`` (or ``pattern``), a module
        that defines the name itself (``def name``/``class name``/``name =`` in its text) but contains none of
        them (and no match) is not parsed: nothing there can be what the question looks for."""
        if not self.of_project(qualified):
            return None  # an installed library's name (`torch.nn.Module`)
        if markers or pattern is not None:
            found = defining_module(qualified, self.path, self.project._read)
            if found is not None:
                text = self.project._read(found[0])
                if not any(m in text for m in markers) and (pattern is None or pattern.search(text) is None):
                    return None
        return self.project.definition(qualified, self.path)

    def callers(self, name: str, markers: tuple[str, ...] = ()) -> list[Site]:
        return self.project.callers(self.path, name, markers)

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
    clear_caches()


def _call(name: str) -> re.Pattern[str]:
    """A call of ``name`` (``name(``, ``x.name(``), literal first for a fast scan."""
    return re.compile(rf"{re.escape(name)}(?<!\w{re.escape(name)})\s*\(")


def _argument(name: str) -> re.Pattern[str]:
    """``name`` handed to a call as a value (``spawn(main_worker, ...)``, ``target=main_worker)``)."""
    return re.compile(rf"{re.escape(name)}(?<!\w{re.escape(name)})\s*[,)]")


def mentioned_in_project(view: ProjectView, word: re.Pattern[str]) -> bool | None:
    """Whether a module of ``view``'s project (a Python file under its import root, itself included) matches
    ``word``; None when the project is too large to search. The files read count for the cache: a mention
    added to any of them changes the answer."""
    root = import_root(view.path)
    if project_too_large(root):
        return None
    return any(word.search(view.project.text(path) or "") for path in project_files(root))
