"""Turns the paths on the command line into the files to check, each with its kind."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lintdist.config import Settings

if TYPE_CHECKING:
    import pathspec

KIND_BY_SUFFIX = {
    ".py": "python",
    ".pyi": "python",
    ".yaml": "config",
    ".yml": "config",
    ".json": "config",
    ".sh": "launch",
    ".bash": "launch",
    # documentation: the code blocks of its pages (Python, YAML, shell); with `docs = false`, only the shell
    # blocks of Markdown pages, the launch commands people copy from a README
    ".md": "page",
    ".mdx": "page",
    ".rst": "page",
    ".ipynb": "notebook",
}


@dataclass(frozen=True)
class Candidate:
    path: Path
    display: str  # as given on the command line, or found under a given directory
    kind: str
    explicit: bool  # named on the command line: always checked, never pre-filtered away


@dataclass(frozen=True)
class DiscoveryError:
    display: str
    message: str


def kind_of(path: Path, explicit: bool, docs: bool = True) -> str | None:
    kind = KIND_BY_SUFFIX.get(path.suffix.lower())
    if kind is None and explicit:
        return "python"
    if kind == "page" and not docs and not explicit:
        return "launch" if path.suffix.lower() == ".md" else None
    return kind


class _Ignorer:
    """``.gitignore`` files (read once per folder) plus ``exclude``/``extend-exclude`` patterns."""

    def __init__(self, settings: Settings) -> None:
        import pathspec  # only a folder walk matches patterns: a check of named files starts without it

        self.root = settings.root
        self._spec_class = pathspec.GitIgnoreSpec
        self.exclude = self._spec_class.from_lines([*settings.exclude, *settings.extend_exclude])
        self._specs: dict[Path, pathspec.PathSpec | None] = {}
        self._chains: dict[Path, list[tuple[Path, pathspec.PathSpec]]] = {}

    def _spec(self, folder: Path) -> pathspec.PathSpec | None:
        if folder not in self._specs:
            try:
                lines = (folder / ".gitignore").read_text(encoding="utf-8", errors="replace").splitlines()
                self._specs[folder] = self._spec_class.from_lines(lines)
            except OSError:
                self._specs[folder] = None
        return self._specs[folder]

    def ignored(self, path: Path, is_dir: bool) -> bool:
        absolute = path.absolute()
        suffix = "/" if is_dir else ""
        try:
            relative = absolute.relative_to(self.root).as_posix()
        except ValueError:
            relative = absolute.name
        if self.exclude.match_file(relative + suffix) or (
            relative != absolute.name and self.exclude.match_file(absolute.name + suffix)
        ):
            return True
        return any(
            spec.match_file(absolute.relative_to(folder).as_posix() + suffix)
            for folder, spec in self._gitignores(absolute.parent)
        )

    def _gitignores(self, folder: Path) -> list[tuple[Path, pathspec.PathSpec]]:
        """The ``.gitignore`` files that apply in ``folder``: its own and its parents', up to the root or the
        repository's top (worked out once per folder, not once per file)."""
        chain = self._chains.get(folder)
        if chain is None:
            spec = self._spec(folder)
            chain = [(folder, spec)] if spec is not None else []
            parent = folder.parent
            if folder != self.root and not (folder / ".git").exists() and parent != folder:
                chain += self._gitignores(parent)
            self._chains[folder] = chain
        return chain


def discover(paths: list[str], settings: Settings) -> tuple[list[Candidate], list[DiscoveryError]]:
    ignorer: _Ignorer | None = None
    candidates: dict[Path, Candidate] = {}
    errors: list[DiscoveryError] = []
    for given in paths:
        path = Path(given)
        if path.is_file() or (path.exists() and not path.is_dir()):
            kind = kind_of(path, explicit=True)
            candidates.setdefault(path.absolute(), Candidate(path, given, kind, True))
            continue
        if not path.exists():
            errors.append(DiscoveryError(given, "no such file or directory"))
            continue
        ignorer = ignorer or _Ignorer(settings)
        for candidate in _walk(path, given, ignorer, errors, settings.docs):
            candidates.setdefault(candidate.path.absolute(), candidate)
    return sorted(candidates.values(), key=lambda c: c.display), errors


def _walk(top: Path, given: str, ignorer: _Ignorer, errors: list[DiscoveryError], docs: bool):
    on_the_way: dict[str, str] = {}  # real path of each folder being walked -> its display name

    def visit(folder: Path, display: str):
        real = os.path.realpath(folder)
        if real in on_the_way:
            errors.append(DiscoveryError(display, f"directory loop: links back to {on_the_way[real]}"))
            return
        on_the_way[real] = display
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as error:
            errors.append(DiscoveryError(display, f"cannot read directory: {error.strerror or error}"))
            on_the_way.pop(real)
            return
        for entry in entries:
            child = folder / entry.name
            child_display = os.path.normpath(os.path.join(display, entry.name))
            try:
                is_dir = entry.is_dir()  # follows links
            except OSError:
                is_dir = False
            if ignorer.ignored(child, is_dir):
                continue
            if is_dir:
                yield from visit(child, child_display)
            elif entry.is_symlink() and not child.exists():
                errors.append(DiscoveryError(child_display, "broken symbolic link"))
            else:
                kind = kind_of(child, explicit=False, docs=docs)
                if kind is not None:
                    yield Candidate(child, child_display, kind, False)
        on_the_way.pop(real)

    yield from visit(top, given)
