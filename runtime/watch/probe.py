"""What this process can say about itself: its collectives (the flight recorder), its main thread's user frame.

Everything here reads state that torch already keeps; nothing adds a collective or touches a process group.
"""

from __future__ import annotations

import os
import pickle
import sys
import sysconfig
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import FrameType
from typing import Any

try:
    from torch._C import _distributed_c10d as _c10d
except ImportError:  # a torch built without distributed support
    _c10d = None

# Functions of torch.distributed that block the caller: the fallback names a collective by them when the flight
# recorder is off.
COLLECTIVE_FUNCTIONS = frozenset(
    {
        "all_reduce",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_object",
        "all_to_all",
        "all_to_all_single",
        "barrier",
        "broadcast",
        "broadcast_object_list",
        "gather",
        "gather_object",
        "reduce",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "scatter",
        "scatter_object_list",
        "monitored_barrier",
    }
)


@dataclass(frozen=True)
class Site:
    """A line of the user's code."""

    file: str
    line: int
    function: str = ""

    def as_list(self) -> list[Any]:
        return [self.file, self.line, self.function]

    @classmethod
    def from_list(cls, value: list[Any] | None) -> Site | None:
        return cls(value[0], int(value[1]), value[2] if len(value) > 2 else "") if value else None

    def __str__(self) -> str:
        return f"{short_path(self.file)}:{self.line}"


@dataclass(frozen=True)
class Collective:
    """One flight-recorder entry: a collective on a process group, with its sequence number and where it was called."""

    group: str
    seq: int
    op: str
    sizes: list[Any]
    site: Site | None
    done: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "seq": self.seq,
            "op": self.op,
            "sizes": self.sizes,
            "site": self.site.as_list() if self.site else None,
            "done": self.done,
        }

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> Collective:
        return cls(
            value["group"], value["seq"], value["op"], value["sizes"], Site.from_list(value["site"]), value["done"]
        )


def short_path(path: str) -> str:
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return path if relative.startswith(".." + os.sep + "..") else relative


@lru_cache(maxsize=1)
def _library_roots() -> tuple[str, ...]:
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(__file__).resolve().parent.parent)}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.add(path)
    roots.update(path for path in sys.path if path.endswith(("site-packages", "dist-packages")))
    return tuple(sorted(os.path.realpath(root) + os.sep for root in roots if root))


@lru_cache(maxsize=4096)
def is_user_file(filename: str) -> bool:
    """True for the training code's own files: not the standard library, not an installed package, not lintdist."""
    if not filename or filename.startswith("<"):
        return False
    return not os.path.realpath(filename).startswith(_library_roots())


def user_frame(frame: FrameType | None) -> FrameType | None:
    """The innermost frame of `frame`'s stack that is in the user's code (else `frame` itself)."""
    current = frame
    while current is not None:
        if is_user_file(current.f_code.co_filename):
            return current
        current = current.f_back
    return frame


def user_site(frame: FrameType | None) -> Site | None:
    """The line of `user_frame(frame)`."""
    found = user_frame(frame)
    return Site(found.f_code.co_filename, found.f_lineno, found.f_code.co_name) if found is not None else None


def caller_site() -> Site | None:
    """The user's line that called into the code calling this function."""
    return user_site(sys._getframe(1))


def thread_frame(ident: int) -> FrameType | None:
    return sys._current_frames().get(ident)


def blocking_function(frame: FrameType | None) -> str | None:
    """The torch.distributed collective the frame is inside, read from the stack (the fallback without a recorder)."""
    while frame is not None:
        code = frame.f_code
        if code.co_name in COLLECTIVE_FUNCTIONS and f"torch{os.sep}distributed{os.sep}" in code.co_filename:
            return code.co_name
        frame = frame.f_back
    return None


def _site_from_frames(frames: list[dict[str, Any]] | None) -> Site | None:
    for frame in frames or ():
        if is_user_file(frame.get("filename", "")):
            return Site(frame["filename"], int(frame["line"]), frame.get("name", ""))
    return None


def _dump(**kwargs: bool) -> dict[str, Any] | None:
    """The flight recorder's dump: gloo's and NCCL's recorders (separate ones where the build has both), merged."""
    merged: dict[str, Any] | None = None
    for name in ("_dump_fr_trace", "_dump_nccl_trace"):
        function = getattr(_c10d, name, None)
        if function is None:
            continue
        try:
            dump = pickle.loads(function(**kwargs))
        except Exception:  # noqa: BLE001, S112 - this recorder is off, or this build cannot dump it
            continue
        if merged is None:
            merged = {"pg_status": {}, "entries": []}
        merged["pg_status"].update(dump.get("pg_status") or {})
        known = {_entry_key(entry) for entry in merged["entries"]}
        merged["entries"] += [entry for entry in dump.get("entries") or () if _entry_key(entry) not in known]
    return merged


def _entry_key(entry: dict[str, Any]) -> tuple[Any, ...]:
    return entry.get("pg_id"), entry.get("record_id"), entry.get("collective_seq_id")


def progress() -> dict[str, tuple[int, int]] | None:
    """Per process group: (last collective enqueued, last completed), from the flight recorder; None when it is off.

    Costs about 10 microseconds: the dump leaves the entries out.
    """
    dump = _dump(includeCollectives=False, includeStackTraces=False)
    if dump is None:
        return None
    status = {}
    for group, state in (dump.get("pg_status") or {}).items():
        status[str(group)] = (
            int(state.get("last_enqueued_collective", -1)),
            int(state.get("last_completed_collective", -1)),
        )
    return status


def recorded(*, limit: int = 200, stacks: bool = True) -> list[Collective] | None:
    """The flight recorder's last `limit` collectives (point-to-point operations left out), oldest first."""
    dump = _dump(includeStackTraces=stacks)
    if dump is None:
        return None
    collectives = []
    for entry in dump.get("entries") or ():
        if entry.get("is_p2p"):
            continue
        done = bool(entry.get("retired")) or entry.get("state") == "completed"
        group = entry.get("process_group") or ("?",)
        collectives.append(
            Collective(
                group=str(group[0]),
                seq=int(entry.get("collective_seq_id", -1)),
                op=str(entry.get("profiling_name", "?")),
                sizes=list(entry.get("input_sizes") or []),
                site=_site_from_frames(entry.get("frames")),
                done=done,
            )
        )
    return collectives[-limit:]


def main_thread_ident() -> int:
    return threading.main_thread().ident or 0
