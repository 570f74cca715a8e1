"""The module graph of the checked tree: which file an import of the project's own code names, the files of a
project, and the imports a script makes. Plain paths and text: no parse (the runner links settings with it
before anything is parsed, and a warm run imports no libcst).

A file is one module of a project: the files under its import root (the folder above its top package, or its
own folder for a script that is in no package, with ``src/`` layouts handled the same way). An import of the
project's own code resolves to a file by the rules Python itself applies (``pkg/mod.py``, ``pkg/mod/__init__.py``,
a namespace folder, relative imports); installed libraries stay names.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path

INSTALLED = frozenset({"site-packages", "dist-packages"})
# A project larger than this is not searched for callers (the answer is then "unknown"): listing stops at one file
# more, and no file of it is read.
MAX_PROJECT_FILES = 2000
MAX_FOLDER_DEPTH = 6
# How many ``from .x import name`` re-exports a definition is followed through.
MAX_REEXPORTS = 3
SKIPPED_FOLDERS = frozenset(
    {".git", ".hg", ".venv", "venv", "env", "node_modules", "__pycache__", "build", "dist", "site-packages"}
    | {".tox", ".nox", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".lintdist_cache", ".eggs"}
)


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
def top_package(path: Path) -> Path | None:
    """The folder of the top package a module belongs to (None for a script in no package)."""
    folder, top = path.parent, None
    while (folder / "__init__.py").is_file() and folder.parent != folder:
        top, folder = folder, folder.parent
    return top


@lru_cache(maxsize=4096)
def module_names(path: Path) -> tuple[str, ...]:
    """The dotted names the file is imported by: from its import root first and then from each folder
    between (a script runs with its own folder on ``sys.path``: ``from utils.dataset import x`` in
    ``pkg/train.py`` names ``pkg/utils/dataset.py``)."""
    root = import_root(path)
    folders = [root]
    folder = path.parent
    while folder != root and root in folder.parents:
        folders.append(folder)
        folder = folder.parent
    names = []
    for base in dict.fromkeys(folders):
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


@lru_cache(maxsize=65536)
def resolve_module(dotted: str, importer: Path) -> Path | None:
    """The project file a dotted module name names, seen from ``importer`` (None: not the project's)."""
    for base in _bases(importer.parent):
        found = _module_file(base, dotted)
        if found is not None:
            return found
    return None


@lru_cache(maxsize=4096)
def _bases(folder: Path) -> tuple[str, ...]:
    """Where absolute imports of a module in ``folder`` start: its import root, the folder itself, ``src/``, and
    for a script in no package the folder above (``python scripts/train.py`` run from the repository, which
    imports the repository's own package: ``from transcoder.data.loader import ...``)."""
    root = import_root(folder / "__init__.py")  # the root of any module in the folder
    bases = [str(root), str(folder)]
    if root == folder and folder.parent != folder:
        bases.append(str(folder.parent))
    if os.path.isdir(os.path.join(root, "src")):
        bases.append(os.path.join(root, "src"))
    return tuple(dict.fromkeys(bases))


@lru_cache(maxsize=65536)
def _module_file(base: str, dotted: str) -> Path | None:
    target = os.path.join(base, *dotted.split("."))
    for candidate in (target + ".py", os.path.join(target, "__init__.py")):
        if os.path.isfile(candidate):
            return Path(os.path.realpath(candidate))
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
    for base in _bases(path.parent):
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
    """The Python files under an import root (bounded in depth; at most one more than ``MAX_PROJECT_FILES``:
    see ``project_too_large``)."""
    return tuple(Path(os.path.realpath(path)) if linked else Path(path) for path, linked in _project_paths(root))


@lru_cache(maxsize=256)
def _project_paths(root: Path) -> tuple[tuple[str, bool], ...]:
    """``project_files`` as plain strings, each with whether it is a link: counting a large tree (a script beside a
    library's sources) makes no path objects."""
    found: list[tuple[str, bool]] = []
    pending = [(str(root), 0)]
    while pending and len(found) <= MAX_PROJECT_FILES:
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
                    pending.append((entry.path, depth + 1))
            elif entry.name.endswith(".py"):
                # the root is resolved and linked folders are not entered: only a linked file needs resolving
                found.append((entry.path, entry.is_symlink()))
    return tuple(found)


def project_too_large(root: Path) -> bool:
    """More Python files under ``root`` than a question searches (a home folder, a large library's tree)."""
    return len(_project_paths(root)) > MAX_PROJECT_FILES


IMPORT_LINE = re.compile(
    r"^[ \t]*(?:from[ \t]+(?P<module>\.*[\w.]*)[ \t]+import[ \t]+(?P<names>\([^)]*\)|[^\n#;]+)"
    r"|import[ \t]+(?P<plain>[^\n#;]+))",
    re.MULTILINE,
)


def imported_files(path: Path, text: str) -> list[Path]:
    """The project files a module's import statements name (``import pkg.mod``, ``from pkg import mod, name``,
    relative imports), in order, once each; found with a pattern over the text, not a parse."""
    found: dict[Path, None] = {}
    for match in IMPORT_LINE.finditer(text):
        if match.group("plain"):
            modules = [part.split()[0] for part in match.group("plain").split(",") if part.strip()]
        else:
            base = absolute(match.group("module"), path)
            modules = [base]
            package = resolve_module(base, path) if base and base.split(".", 1)[0] in local_top_names(path) else None
            if package is not None and package.name == "__init__.py":  # `from pkg import mod`: a submodule
                names = match.group("names").strip("() \t\n").replace("\n", " ")
                modules += [f"{base}.{n.split()[0]}" for n in names.split(",") if n.strip()]
        tops = local_top_names(path)
        for module in modules:
            module = module.strip(".").rstrip(",")
            if not module or module.split(".", 1)[0] not in tops:
                continue  # an installed library (nothing of the project's is named so)
            target = resolve_module(module, path)
            if target is not None and target != path.resolve():
                found[target] = None
    return list(found)


def clear_caches() -> None:
    """Forget what the file system said (a new run: files may have appeared or moved)."""
    for cached in (import_root, top_package, module_names, resolve_module, _bases, _module_file):
        cached.cache_clear()
    for cached in (local_top_names, project_files, _project_paths):
        cached.cache_clear()


def defining_module(qualified: str, importer: Path, read, depth: int = 0) -> tuple[Path, str] | None:
    """The file that defines what ``qualified`` names (read in ``importer``), and the name there, following
    ``from .x import name`` re-exports in the text (``read(path)`` gives a file's text); None when the text
    does not say (a name made some other way)."""
    found = resolve_name(qualified, importer)
    if found is None or "." in found[1]:
        return None
    path, name = found
    text = read(path)
    if text is None:
        return None
    if re.search(
        rf"^(?:async[ \t]+)?(?:def|class)[ \t]+{re.escape(name)}\b|^{re.escape(name)}[ \t]*[:=]", text, re.MULTILINE
    ):
        return path, name
    if depth >= MAX_REEXPORTS:
        return None
    for match in IMPORT_LINE.finditer(text):
        if match.group("plain"):
            continue
        names = match.group("names").strip("() \t\n").replace("\n", " ")
        for item in names.split(","):
            parts = item.split()
            if parts and (parts[-1] == name and (len(parts) == 1 or parts[-2] == "as")):
                source = absolute(match.group("module"), path)
                return defining_module(f"{source}.{parts[0]}", path, read, depth + 1)
    return None
