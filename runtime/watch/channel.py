"""The side channel: a TCPStore client of its own on the launcher's store, under a key prefix of its own.

Store requests are not collectives: they do not touch the user's process groups or their sequence numbers, and
the store answers while every rank's training thread is blocked in a collective.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from typing import Any

import torch.distributed as dist

STORE_TIMEOUT = timedelta(seconds=10)


def _run_prefix() -> str:
    run = os.environ.get("TORCHELASTIC_RUN_ID", "run")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"lintdist-watch/{run}/{restart}/"


def connect_store() -> tuple[Any, str]:
    """A new store client: on MASTER_ADDR/MASTER_PORT (torchrun, accelerate, most mp.spawn scripts), else a clone of
    the default process group's store (a `tcp://` or file init method). Returns (store, where it is)."""
    address, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if address and port:
        try:
            store = dist.TCPStore(address, int(port), is_master=False, timeout=STORE_TIMEOUT, wait_for_workers=False)
            return store, f"{address}:{port}"
        except (RuntimeError, ValueError, OSError):  # no server there: fall back to the process group's own store
            pass
    default = dist.distributed_c10d._get_default_store()
    return default.clone(), type(default).__name__


class Channel:
    """Keys per rank (status, history), a report, findings, and values compared across ranks."""

    def __init__(self, store: Any, rank: int, world_size: int, namespace: str = "") -> None:
        self.store = dist.PrefixStore(_run_prefix() + namespace, store)
        self.rank = rank
        self.world_size = world_size
        self._findings_read = 0

    @classmethod
    def open(cls, rank: int, world_size: int, namespace: str = "") -> tuple[Channel, str]:
        store, where = connect_store()
        return cls(store, rank, world_size, namespace), where

    def _get(self, key: str) -> Any | None:
        if not self.store.check([key]):
            return None
        return json.loads(self.store.get(key))

    def _set(self, key: str, value: Any) -> None:
        self.store.set(key, json.dumps(value))

    def _per_rank(self, prefix: str) -> dict[int, Any]:
        keys = [f"{prefix}/{rank}" for rank in range(self.world_size)]
        if self.store.check(keys):
            return {rank: json.loads(raw) for rank, raw in enumerate(self.store.multi_get(keys))}
        return {rank: value for rank in range(self.world_size) if (value := self._get(keys[rank])) is not None}

    # statuses and histories
    def post_status(self, status: dict[str, Any]) -> None:
        self._set(f"status/{self.rank}", status)

    def statuses(self) -> dict[int, dict[str, Any]]:
        return self._per_rank("status")

    def post_history(self, history: list[dict[str, Any]]) -> None:
        self._set(f"history/{self.rank}", history)

    def histories(self) -> dict[int, list[dict[str, Any]]]:
        return self._per_rank("history")

    def request_histories(self) -> int:
        return int(self.store.add("request", 1))

    def requests(self) -> int:
        return int(self.store.add("request", 0))

    # the report that ends the job
    def post_report(self, report: dict[str, Any]) -> bool:
        """Post the hang report; False when another rank posted one first."""
        if int(self.store.add("reported", 1)) != 1:
            return False
        self._set("report", report)
        return True

    def report(self) -> dict[str, Any] | None:
        return self._get("report")

    # findings, once per claim
    def post_finding(self, claim: str, finding: dict[str, Any]) -> None:
        if int(self.store.add(f"claim/{claim}", 1)) == 1:
            index = int(self.store.add("findings", 1))
            self._set(f"finding/{index}", finding)

    def new_findings(self) -> list[dict[str, Any]]:
        count = int(self.store.add("findings", 0))
        found = []
        while self._findings_read < count:
            value = self._get(f"finding/{self._findings_read + 1}")
            if value is None:  # posted index, value not yet written: read it next time
                break
            found.append(value)
            self._findings_read += 1
        return found

    # values every rank posts under the same key, compared by the leader
    def post_value(self, kind: str, key: str, value: Any) -> None:
        self._set(f"value/{kind}/{key}/{self.rank}", value)

    def values(self, kind: str, key: str) -> dict[int, Any] | None:
        """Every rank's value, or None while one is missing."""
        keys = [f"value/{kind}/{key}/{rank}" for rank in range(self.world_size)]
        if not self.store.check(keys):
            return None
        return {rank: json.loads(raw) for rank, raw in enumerate(self.store.multi_get(keys))}
