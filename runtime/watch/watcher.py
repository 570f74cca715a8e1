"""The watcher thread of one rank: post this rank's status, answer requests, and on the leader decide and report."""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.distributed as dist

from lintdist.runtime._dist import is_distributed
from lintdist.runtime.watch import probe
from lintdist.runtime.watch.channel import Channel
from lintdist.runtime.watch.checks import Checks, compare_batches, compare_gradients
from lintdist.runtime.watch.hang import Limits, diagnose, explain
from lintdist.runtime.watch.probe import Collective, Site

PREFIX = "lintdist watch:"
_DEBUG = bool(os.environ.get("LINTDIST_WATCH_DEBUG"))


@dataclass
class Options:
    """What `python -m lintdist.runtime.watch` was asked to do."""

    report: str = "lintdist-watch.json"
    exit_code: int = 3  # 0: report a hang but let the job wait
    interval: float = 0.5
    limits: Limits = field(default_factory=Limits)
    hangs: bool = True
    checks: bool = True
    grad_every: int = 50


class Watcher:
    """One per process; `start()` before the script runs, `finish()` when it ends (normally or not)."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.checks = Checks(self._world_size, grad_every=options.grad_every)
        self.channel: Channel | None = None
        self.rank = -1
        self.world_size = 0
        self.where = ""
        self.findings: list[dict[str, Any]] = []
        self.reported = False
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.RLock()
        self._main = probe.main_thread_ident()
        self._progress: dict[str, tuple[int, int]] | None = None
        self._progress_since = time.time()
        self._active: list[dict[str, Any]] = []
        self._active_for: Any = None
        self._site: Site | None = None
        self._site_since = time.time()
        self._answered = 0
        self._pending: tuple[Any, float] | None = None
        self._compare: list[tuple[str, str]] = []
        self._exit: dict[str, Any] | None = None
        self._closed = False
        self.polls = 0
        self.cpu_seconds = 0.0  # the watcher thread's own CPU time

    # -- life cycle ------------------------------------------------------------------------------------------
    def start(self) -> None:
        if self.options.checks:
            self.checks.install()
        self._hook_process_group()
        self._thread = threading.Thread(target=self._run, name="lintdist-watch", daemon=True)
        self._thread.start()

    def _hook_process_group(self) -> None:
        """Attach right after `init_process_group` and before `destroy_process_group`, on the training thread.

        A short job can create and destroy its group between two polls; the thread's own wait for a group
        covers the other ways a group comes up.
        """
        c10d = dist.distributed_c10d
        init, destroy = c10d.init_process_group, c10d.destroy_process_group

        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            result = init(*args, **kwargs)
            self.attach()
            return result

        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            if not args and not kwargs.get("group"):
                self.attach()
                with self._lock:
                    if self.channel is not None:
                        self._flush_outbox()
            return destroy(*args, **kwargs)

        for module in (dist, c10d):
            module.init_process_group = functools.wraps(init)(init_process_group)
            module.destroy_process_group = functools.wraps(destroy)(destroy_process_group)

    def attach(self) -> bool:
        """Open the side channel once the default process group exists; True when it is open."""
        with self._lock:
            if self.channel is not None or self._closed:
                return self.channel is not None
            if not is_distributed():
                return False
            try:
                self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
                self.channel, self.where = Channel.open(self.rank, self.world_size)
            except Exception as error:  # noqa: BLE001 - no store to talk through: the job runs unwatched
                self._closed = True
                print(f"{PREFIX} no side channel ({error}); the job runs unwatched", file=sys.stderr, flush=True)
                return False
            return True

    def _world_size(self) -> int:
        return self.world_size or (dist.get_world_size() if is_distributed() else 1)

    def _run(self) -> None:
        while not self._stop.is_set() and not self.attach():
            if self._closed:
                return
            time.sleep(0.1)
        while not self._stop.wait(self.options.interval):
            try:
                with self._lock:
                    if self.channel is None:
                        return
                    self._poll()
                    self.polls += 1
                    self.cpu_seconds = time.thread_time()
            except Exception:  # noqa: BLE001 - the store went away (the job is ending): never take the job down
                if self._stop.is_set():
                    return
                time.sleep(self.options.interval)

    def finish(self, error: BaseException | None) -> int | None:
        """Called on the training thread when the script ends; returns an exit code when the job must end with it."""
        self._stop.set()
        if not self.attach():
            self._closed = True  # a group made after the script ended (another test, a REPL) is not watched
            return None
        failed = _collective_failed(error)
        crashed = error is not None and not failed and not isinstance(error, (SystemExit, KeyboardInterrupt))
        site = _exit_site(error)
        with self._lock:
            try:
                self._flush_outbox()
                # The call sites are worth their second only when another rank is still waiting in a collective.
                waiting = any(s.get("active") for r, s in self.channel.statuses().items() if r != self.rank)
                self.channel.post_history(self._history(stacks=error is not None or waiting))
                now = time.time()
                if failed:
                    # The collective this rank was in failed because a peer went away: report it as still waiting
                    # there, so the leader can name the peer.
                    status = self._status(now)
                    entries = status["active"] or [
                        {**entry.as_dict(), "done": False} for entry in (probe.recorded(limit=1, stacks=False) or [])
                    ]
                    status.update(
                        active=entries, stuck_since=now - self.options.limits.confirm, failed=_describe(error)
                    )
                    if site is not None:  # the line that raised, not the caller of this function
                        status["site"] = site.as_list()
                else:
                    self._exit = {
                        "site": site.as_list() if site else None,
                        "error": _describe(error),
                        "crashed": crashed,
                    }
                    status = self._status(now)
                self.channel.post_status(status)
                if crashed:  # the launcher ends the job; the traceback says why
                    return None
                if self.rank == 0 or failed:
                    return self._final_pass(error)
            except Exception:  # noqa: BLE001 - the store is gone: nothing left to say
                return None
            finally:
                # Drop the store client here, on the training thread, not in interpreter shutdown.
                self.channel, self._closed = None, True
        return None

    def _final_pass(self, error: BaseException | None) -> int | None:
        """Before this process exits: wait briefly for the others, report what is left, and a hang seen from here."""
        deadline = time.time() + (4.0 if error is not None else 2.0)
        while time.time() < deadline:
            statuses = self.channel.statuses()
            self._lead_findings()
            if all(status.get("exit") for status in statuses.values()) and len(statuses) == self.world_size:
                break
            divergence = diagnose(statuses, time.time(), self.options.limits) if self.options.hangs else None
            if divergence is not None:
                return self._report_hang(divergence, statuses)
            time.sleep(0.1)
        self._lead_findings()
        if self.rank == 0:
            self._write_report()
        return None

    # -- one poll -----------------------------------------------------------------------------------------------
    def _poll(self) -> None:
        now = time.time()
        channel = self.channel
        self.channel.post_status(self._status(now))
        self._flush_outbox()
        report = channel.report()
        if report is not None and not self.reported:
            self._end_by_report(report)
        requested = channel.requests()
        if requested > self._answered:
            self._answered = requested
            channel.post_history(self._history())
        statuses = channel.statuses()
        if self.rank == self._leader(statuses, now):
            self._lead(now, statuses)

    def _status(self, now: float) -> dict[str, Any]:
        frame = probe.thread_frame(self._main)
        site = probe.user_site(frame)
        if site != self._site:
            self._site, self._site_since = site, now
        progress = probe.progress() if self.options.hangs else None
        waiting = False
        if progress is not None:
            waiting = any(enqueued > completed for enqueued, completed in progress.values())
            if progress != self._progress or not waiting:
                self._progress, self._progress_since = progress, now
            if waiting and now - self._progress_since >= self.options.limits.confirm:
                if self._active_for != progress:
                    # Without stack traces: the first dump with them costs about a second (symbolisation). A rank
                    # blocked in a collective is at its call site, so the training thread's line stands in.
                    entries = probe.recorded(limit=64, stacks=False) or []
                    self._active = [
                        {**entry.as_dict(), "site": site.as_list() if site else None}
                        for entry in entries
                        if not entry.done
                    ][-8:]
                    self._active_for = progress
            else:
                self._active, self._active_for = [], None
        elif self.options.hangs:
            function = probe.blocking_function(frame)
            if function is None:
                self._active, self._progress_since = [], now
            elif not self._active or self._active[0]["op"] != function:
                self._active = [Collective("?", -1, function, [], site, False).as_dict()]
                self._progress_since = now
            waiting = bool(self._active)
        return {
            "rank": self.rank,
            "t": now,
            "progress": {group: list(value) for group, value in (progress or {}).items()},
            "stuck_since": self._progress_since if waiting and self._active else None,
            "active": self._active if waiting else [],
            "site": site.as_list() if site else None,
            "site_since": self._site_since,
            "exit": self._exit,
        }

    def _history(self, stacks: bool = True) -> list[dict[str, Any]]:
        # With stacks the first dump costs about a second (symbolisation): only when a hang is being named.
        return [entry.as_dict() for entry in probe.recorded(limit=200, stacks=stacks) or []]

    def _flush_outbox(self) -> None:
        outbox = self.checks.outbox
        while outbox:
            item = outbox.popleft()
            if item[0] == "finding":
                self.channel.post_finding(item[1], item[2])
            else:
                _, kind, key, value = item
                self.channel.post_value(kind, key, value)
                if self.rank == 0:
                    self._compare.append((kind, key))

    def _leader(self, statuses: dict[int, dict[str, Any]], now: float) -> int:
        """Rank 0, or the lowest rank still running when rank 0 has exited (it can no longer report)."""
        running = [
            rank
            for rank, status in statuses.items()
            if not status.get("exit") and now - float(status.get("t", now)) <= self.options.limits.stale
        ]
        return min(running, default=self.rank)

    # -- the leader ------------------------------------------------------------------------------------------------
    def _lead(self, now: float, statuses: dict[int, dict[str, Any]]) -> None:
        self._lead_findings()
        if not self.options.hangs or self.world_size < 2:
            return
        divergence = diagnose(statuses, now, self.options.limits)
        if _DEBUG:
            print(
                f"{PREFIX} debug {now:.2f} {divergence} {[(r, s.get('stuck_since') and round(now - s['stuck_since'], 1), [a['seq'] for a in s['active']]) for r, s in statuses.items()]}",
                file=sys.stderr,
                flush=True,
            )
        if divergence is None:
            self._pending = None
            return
        if self._pending is None or self._pending[0] != divergence:
            self._pending = (divergence, now)
            return
        if now - self._pending[1] >= self.options.limits.confirm:
            code = self._report_hang(divergence, statuses)
            if code is not None:
                os._exit(code)

    def _lead_findings(self) -> None:
        for kind, key in list(self._compare):
            values = self.channel.values(kind, key)
            if values is None:
                continue
            self._compare.remove((kind, key))
            finding = compare_batches(key, values) if kind == "batch" else compare_gradients(key, values)
            if finding is not None:
                self.channel.post_finding(f"{finding['code']}:{kind}", finding)
        for finding in self.channel.new_findings():
            self._emit(finding)

    def _report_hang(self, divergence: Any, statuses: dict[int, dict[str, Any]]) -> int | None:
        channel = self.channel
        channel.request_histories()
        self._answered = channel.requests()
        channel.post_history(self._history())
        deadline = time.time() + 3.0
        histories = channel.histories()
        while len(histories) < len(statuses) and time.time() < deadline:
            time.sleep(0.1)
            histories = channel.histories()
        statuses = channel.statuses() or statuses
        parsed = {rank: [Collective.from_dict(item) for item in history] for rank, history in histories.items()}
        report = explain(divergence, statuses, parsed, time.time(), self.options.limits)
        if not channel.post_report(report.as_dict()):
            return None
        self.reported = True
        ending = self.options.exit_code != 0
        self._emit(report.as_dict(), text=report.text(), ending=ending)
        if not ending:
            return None
        time.sleep(2 * self.options.interval)  # let the other ranks read the report and end themselves
        return self.options.exit_code

    def _end_by_report(self, report: dict[str, Any]) -> None:
        self.reported = True
        if self.options.exit_code == 0:
            return
        print(
            f"{PREFIX} rank {self.rank} ends: {report['code']} reported (see {self.options.report})",
            file=sys.stderr,
            flush=True,
        )
        os._exit(self.options.exit_code)

    # -- output -----------------------------------------------------------------------------------------------------
    def _emit(self, finding: dict[str, Any], text: str | None = None, ending: bool = False) -> None:
        self.findings.append(finding)
        where = f"{probe.short_path(finding['file'])}:{finding['line']}: " if finding.get("file") else ""
        lines = [f"{PREFIX} {where}{text or finding['code'] + ' ' + finding['name'] + ': ' + finding['message']}"]
        if ending:
            lines.append(
                f"{PREFIX} report written to {self.options.report}; ending the job (exit code {self.options.exit_code})"
            )
        print("\n".join(lines), file=sys.stderr, flush=True)
        self._write_report()

    def _write_report(self) -> None:
        _write_json(
            Path(self.options.report),
            {
                "world_size": self.world_size,
                "store": self.where,
                "findings": self.findings,
                "watcher": {"rank": self.rank, "polls": self.polls, "cpu_seconds": round(self.cpu_seconds, 4)},
            },
        )


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=path.name, dir=path.parent)
    with os.fdopen(handle, "w") as out:
        json.dump(value, out, indent=2)
        out.write("\n")
    os.replace(temporary, path)


def _exit_site(error: BaseException | None) -> Site | None:
    if error is None or error.__traceback__ is None:
        return None
    for frame, line in reversed(list(traceback.walk_tb(error.__traceback__))):
        if probe.is_user_file(frame.f_code.co_filename):
            return Site(frame.f_code.co_filename, line, frame.f_code.co_name)
    return None


def _collective_failed(error: BaseException | None) -> bool:
    """A collective raised because a peer is gone (gloo: "Connection closed by peer"; NCCL: a watchdog abort)."""
    if error is None:
        return False
    if isinstance(error, getattr(dist, "DistError", ())):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and any(word in text for word in ("gloo", "NCCL", "Connection closed"))


def _describe(error: BaseException | None) -> str | None:
    if error is None or (isinstance(error, SystemExit) and error.code in (None, 0)):
        return None
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200]}" if text else type(error).__name__
