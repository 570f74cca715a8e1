"""Results cached by file content, settings and lintdist version, under ``.lintdist_cache/``.

One file per (version, settings) holds every checked file's entry. An entry is
keyed by the content hash; the file's size and mtime are kept beside it so a
warm run recognises an unchanged file from ``stat`` alone, without reading it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import astuple, dataclass, field, replace
from pathlib import Path

from lintdist import __version__
from lintdist.config import CACHE_FOLDER


@dataclass(frozen=True)
class Entry:
    size: int
    mtime_ns: int
    digest: str
    findings: list[dict]
    # the project's other files the check read: path -> [size, mtime_ns, digest] (a change re-checks this file)
    dependencies: dict[str, list] = field(default_factory=dict)


class ResultCache:
    def __init__(self, root: Path, settings_fingerprint: tuple) -> None:
        self.folder = root / CACHE_FOLDER / __version__
        name = hashlib.sha256(repr(settings_fingerprint).encode()).hexdigest()[:16]
        self.file = self.folder / f"{name}.json"
        self.entries: dict[str, Entry] = {}
        self.dirty = False
        # JSON, not pickle: a cache folder is data, and loading it must never run code.
        try:
            with open(self.file, encoding="utf-8") as handle:
                self.entries = {key: Entry(*value) for key, value in json.load(handle).items()}
        except (OSError, ValueError, TypeError, AttributeError):
            self.entries = {}

    def lookup(self, key: str, path: Path, extra: tuple) -> tuple[list[dict] | None, str | None]:
        """Cached findings, or None and the content digest to store results under."""
        try:
            stat = path.stat()
        except OSError:
            return None, None
        entry = self.entries.get(key)
        tag = _extra_tag(extra)
        unchanged = entry is not None and (entry.size, entry.mtime_ns) == (stat.st_size, stat.st_mtime_ns)
        if unchanged and entry.digest.startswith(tag):
            return (entry.findings, entry.digest) if self._dependencies_hold(key, entry) else (None, entry.digest)
        try:
            digest = tag + hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError:
            return None, None
        if entry is not None and entry.digest == digest and self._dependencies_hold(key, entry):
            self.entries[key] = replace(entry, size=stat.st_size, mtime_ns=stat.st_mtime_ns)
            self.dirty = True
            return entry.findings, digest
        return None, digest

    def _dependencies_hold(self, key: str, entry: Entry) -> bool:
        """Every file the cached check read is as it was (by size and time, else by content)."""
        stamps = dict(entry.dependencies)
        for name, (size, mtime_ns, digest) in entry.dependencies.items():
            path = Path(name)
            try:
                stat = path.stat()
            except OSError:
                return False
            if (stat.st_size, stat.st_mtime_ns) == (size, mtime_ns):
                continue
            try:
                if file_digest(path.read_bytes()) != digest:
                    return False
            except OSError:
                return False
            stamps[name] = [stat.st_size, stat.st_mtime_ns, digest]
        if stamps != entry.dependencies:
            self.entries[key] = replace(entry, dependencies=stamps)
            self.dirty = True
        return True

    def store(
        self, key: str, path: Path, digest: str | None, findings: list[dict], dependencies: dict | None = None
    ) -> None:
        if digest is None:
            return
        try:
            stat = path.stat()
        except OSError:
            return
        self.entries[key] = Entry(stat.st_size, stat.st_mtime_ns, digest, findings, dependencies or {})
        self.dirty = True

    def save(self) -> None:
        if not self.dirty:
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            gitignore = self.folder.parent / ".gitignore"
            if not gitignore.exists():
                gitignore.write_text("# Created by lintdist.\n*\n", encoding="utf-8")
            handle, temporary = tempfile.mkstemp(dir=self.folder, suffix=".tmp")
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump({key: astuple(entry) for key, entry in self.entries.items()}, out)
            os.replace(temporary, self.file)
        except OSError:
            pass  # a read-only checkout still gets its results, only not cached


def file_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _extra_tag(extra: tuple) -> str:
    """A short tag of the per-file inputs besides the content (kind, enabled codes, launch settings)."""
    return hashlib.sha256(repr(extra).encode()).hexdigest()[:12] + ":"
