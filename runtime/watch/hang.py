"""Decide, from every rank's status, whether the ranks wait in collectives that can never match; name the cause.

Pure functions over the statuses the ranks post through the side channel, so they are tested without a job.
A stall where the ranks agree (the same collective, or one rank still computing) is only slow, not reported.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from lintdist.runtime.watch.probe import Collective, Site
from lintdist.runtime.watch.source import Guard, enclosing_loop, line_text, local_exits, rank_guard

GROUP_NAMES = {"0": "the default group"}


@dataclass(frozen=True)
class Limits:
    """How long a disagreement must last before it is reported (seconds)."""

    confirm: float = 1.0  # a rank's collective counters unchanged this long: it is waiting
    different: float = 10.0  # two ranks waiting in collectives that share no sequence number
    stall: float = 600.0  # a rank waits while another sits on one line outside any collective
    stale: float = 30.0  # a rank that posted nothing this long is gone


@dataclass(frozen=True)
class Divergence:
    """Rank `waiting` is in a collective that rank `other` will not join."""

    kind: str  # "op" (same sequence number, different op), "exited", "different", "stalled"
    waiting: int
    other: int
    group: str
    seq: int


def _state(status: dict[str, Any], now: float, limits: Limits) -> str:
    if status.get("exit"):
        return "crashed" if status["exit"].get("crashed") else "exited"
    if now - float(status.get("t", now)) > limits.stale:
        return "gone"
    if status.get("active") and now - float(status.get("stuck_since") or now) >= limits.confirm:
        return "waiting"
    return "running"


def _active(status: dict[str, Any]) -> dict[tuple[str, int], Collective]:
    entries = (Collective.from_dict(item) for item in status.get("active") or ())
    return {(entry.group, entry.seq): entry for entry in entries if not entry.done}


def diagnose(statuses: dict[int, dict[str, Any]], now: float, limits: Limits = Limits()) -> Divergence | None:
    """The first disagreement between a waiting rank and another rank, or None while the ranks can still meet."""
    states = {rank: _state(status, now, limits) for rank, status in statuses.items()}
    for rank in sorted(statuses):
        if states[rank] != "waiting":
            continue
        mine = _active(statuses[rank])
        if not mine:
            continue
        group, seq = min(mine)
        for other in sorted(statuses):
            if other == rank:
                continue
            if states[other] == "crashed":  # an exception ends the job through the launcher; no hang to name
                continue
            if states[other] in ("exited", "gone"):
                return Divergence("exited", rank, other, group, seq)
            theirs = _active(statuses[other])
            if states[other] == "waiting":
                common = sorted(set(mine) & set(theirs))
                both = min(now - statuses[rank]["stuck_since"], now - statuses[other]["stuck_since"])
                for key in common:
                    # Without a recorder (sequence number -1) the blocking functions are compared, after a while.
                    if mine[key].op != theirs[key].op and (key[1] >= 0 or both >= limits.different):
                        return Divergence("op" if key[1] >= 0 else "different", rank, other, *key)
                if not common and key_groups_overlap(mine, theirs) and both >= limits.different:
                    return Divergence("different", rank, other, group, seq)
                continue
            behind = (statuses[other].get("progress") or {}).get(group, (seq - 1, 0))[0] < seq
            still = now - float(statuses[other].get("site_since") or now)
            if behind and still >= limits.stall:
                return Divergence("stalled", rank, other, group, seq)
    return None


def key_groups_overlap(mine: dict[tuple[str, int], Collective], theirs: dict[tuple[str, int], Collective]) -> bool:
    return bool({group for group, _ in mine} & {group for group, _ in theirs})


def first_divergence(histories: dict[int, list[Collective]], leader: int = 0) -> tuple[str, int] | None:
    """The earliest (group, sequence number) where another rank's collective does not match the leader's.

    A different op is a divergence. A different call site is one only when one of the two lines is also called
    by the other rank at another sequence number (one rank is a collective ahead): two branches of a rank test
    that each call the same collective once are a match.
    """
    if leader not in histories:
        return None
    found: list[tuple[str, int]] = []
    mine = {(c.group, c.seq): c for c in histories[leader]}
    for rank, history in histories.items():
        if rank == leader:
            continue
        theirs = {(c.group, c.seq): c for c in history}
        my_sites = {(c.group, c.site) for c in histories[leader]}
        their_sites = {(c.group, c.site) for c in history}
        for key in sorted(set(mine) & set(theirs)):
            a, b = mine[key], theirs[key]
            if a.op != b.op:
                found.append(key)
                break
            if a.site != b.site and ((key[0], a.site) in their_sites or (key[0], b.site) in my_sites):
                found.append(key)
                break
    return min(found, key=lambda key: key[1]) if found else None


@dataclass
class RankView:
    """What the report says about one rank."""

    rank: int
    state: str
    site: Site | None
    collective: Collective | None = None
    guard: Guard | None = None
    note: str = ""
    waiting_since: float | None = None
    exited_at: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "state": self.state,
            "file": self.site.file if self.site else None,
            "line": self.site.line if self.site else None,
            "code": line_text(self.site) if self.site else None,
            "collective": self.collective.as_dict() if self.collective else None,
            "rank_guard": {"line": self.guard.line, "test": self.guard.test, "branch": self.guard.branch}
            if self.guard
            else None,
            "note": self.note,
            "waiting_since": self.waiting_since,
            "exited_at": self.exited_at,
        }


@dataclass
class HangReport:
    code: str
    name: str
    message: str
    divergence: Divergence
    ranks: list[RankView] = field(default_factory=list)
    first: tuple[str, int] | None = None
    reported_at: float = field(default_factory=time.time)

    def as_dict(self) -> dict[str, Any]:
        named = next((view for view in self.ranks if view.guard), None) or next(
            view for view in self.ranks if view.rank == self.divergence.waiting
        )
        group, seq = self.first or (self.divergence.group, self.divergence.seq)
        return {
            "code": self.code,
            "name": self.name,
            "severity": "error",
            "kind": "hang",
            "message": self.message,
            "file": named.site.file if named.site else None,
            "line": named.site.line if named.site else None,
            "group": group,
            "seq": seq,
            "op": named.collective.op if named.collective else None,
            "reported_at": self.reported_at,
            "ranks": [view.as_dict() for view in self.ranks],
        }

    def text(self) -> str:
        lines = [f"{self.code} {self.name}: {self.message}"]
        for view in self.ranks:
            where = f"{view.site}  {line_text(view.site)}" if view.site else "(no user frame)"
            what = view.state
            if view.collective is not None:
                what = f"{view.state} in {view.collective.op} #{view.collective.seq} on {group_name(view.collective.group)}"
            lines.append(f"  rank {view.rank}: {what} at {where}")
            if view.guard:
                lines.append(f"          under {view.guard.describe()} (line {view.guard.line})")
            if view.note:
                lines.append(f"          {view.note}")
        return "\n".join(lines)


def group_name(group: str) -> str:
    return GROUP_NAMES.get(group, f"process group {group}")


def _site_at(history: list[Collective], key: tuple[str, int] | None) -> Collective | None:
    if key is None:
        return None
    return next((c for c in history if (c.group, c.seq) == key), None)


def explain(
    divergence: Divergence,
    statuses: dict[int, dict[str, Any]],
    histories: dict[int, list[Collective]],
    now: float,
    limits: Limits = Limits(),
) -> HangReport:
    """Build the report: each rank's line and collective, the rank guard, and which rule the shape is."""
    leader = min(histories) if histories else divergence.waiting
    first = first_divergence(histories, leader) or (divergence.group, divergence.seq)
    views = []
    for rank in sorted(statuses):
        status = statuses[rank]
        state = _state(status, now, limits)
        at_first = _site_at(histories.get(rank, []), first)
        active = _active(status)
        current = active.get(first) or (active[min(active)] if active else None)
        exit_info = status.get("exit") or {}
        site = Site.from_list(exit_info.get("site")) if state == "exited" else Site.from_list(status.get("site"))
        collective = at_first or current
        view = RankView(rank, state, (collective.site if collective and collective.site else site), collective)
        if state == "waiting" and status.get("failed"):
            view.note = f"its collective failed (the peer is gone): {status['failed']}"
        elif state == "waiting":
            view.waiting_since = float(status["stuck_since"])
            view.note = f"waiting {now - float(status['stuck_since']):.1f} s"
            if current is not None and at_first is not None and (current.group, current.seq) != first:
                view.note += f", now in {current.op} #{current.seq} at {current.site or site}"
        elif state == "exited":
            view.exited_at = float(status.get("t", now))
            view.note = "exited" + (f": {exit_info['error']}" if exit_info.get("error") else "")
            view.collective = at_first
        elif state == "gone":
            view.note = f"posted nothing for {now - float(status.get('t', now)):.0f} s"
        view.guard = rank_guard(view.site)
        views.append(view)
    return _classify(divergence, views, statuses, first)


def _classify(
    divergence: Divergence, views: list[RankView], statuses: dict[int, dict[str, Any]], first: tuple[str, int]
) -> HangReport:
    waiting = next(view for view in views if view.rank == divergence.waiting)
    other = next(view for view in views if view.rank == divergence.other)
    seq_text = f"collective #{first[1]} on {group_name(first[0])}"
    guarded = [view for view in views if view.guard]
    if guarded:
        names = ", ".join(f"rank {view.rank} at {view.site}" for view in guarded)
        message = (
            f"the ranks diverge at {seq_text}: {names} is under a rank test, so the other ranks never make the same "
            "call and wait until the process-group timeout. Call the collective on every rank, outside the rank test."
        )
        return HangReport("LD405", "collective-in-rank-guard", message, divergence, views, first)
    for stayed, left in ((waiting, other), (other, waiting)):
        report = _left_loop(divergence, views, statuses, first, stayed, left, seq_text)
        if report is not None:
            return report
    if divergence.kind == "exited":
        message = (
            f"rank {other.rank} has {other.state} while rank {waiting.rank} waits in {seq_text}: "
            "the collective can never complete. Every rank must make the same collectives in the same order."
        )
    else:
        message = (
            f"the ranks are in different collectives at {seq_text} and will wait until the process-group timeout. "
            "Every rank must make the same collectives in the same order."
        )
    return HangReport("LD405", "collective-in-rank-guard", message, divergence, views, first)


def _left_loop(
    divergence: Divergence,
    views: list[RankView],
    statuses: dict[int, dict[str, Any]],
    first: tuple[str, int],
    stayed: RankView,
    left: RankView,
    seq_text: str,
) -> HangReport | None:
    """LD402 when `left` is out of the loop `stayed` waits in, and that loop has an exit under a local condition."""
    if stayed.state not in ("waiting", "running"):
        return None
    loop = enclosing_loop(Site.from_list(statuses[stayed.rank].get("site")) or stayed.site)
    left_site = Site.from_list((statuses[left.rank].get("exit") or {}).get("site")) or Site.from_list(
        statuses[left.rank].get("site")
    )
    if loop is None or (left.state not in ("exited", "gone") and loop.contains(left_site)):
        return None
    exits = local_exits(loop)
    if not exits:
        return None
    named = " or ".join(f"the `{item.kind}` at line {item.line} under `if {item.condition}:`" for item in exits)
    where = "has exited" if left.state in ("exited", "gone") else f"is at {left_site}, after the loop,"
    message = (
        f"rank {left.rank} left the loop `{loop.header}` ({Site(loop.file, loop.line)}) through {named}, a condition each rank computes for "
        f"itself; it {where} while rank {stayed.rank} is still in the loop, waiting in {seq_text}. Decide the stop "
        "on every rank together (an all-reduce of the flag, accelerate's set_trigger/check_trigger, or "
        "lintdist.runtime.any_rank)."
    )
    left.note = (left.note + "; " if left.note else "") + f"left the loop at line {exits[0].line}"
    return HangReport("LD402", "local-early-stop", message, divergence, views, first)
