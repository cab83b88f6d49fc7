"""The agent's durable outbox: one gzip file per sealed envelope, delivered in order.

Files are named by batch sequence number, written to a temporary name, fsynced and renamed, so
a crash leaves either a whole envelope or none. Total size is bounded; past the bound the
oldest envelopes are dropped and counted (an unbounded disk is worse than a loud gap).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

log = logging.getLogger(__name__)

SUFFIX = ".json.gz"


class Outbox:
    def __init__(self, directory: Path, *, max_bytes: int = 1 << 30, fsync: bool = True) -> None:
        self.dir = directory
        self.dead = directory / "dead"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dead.mkdir(exist_ok=True)
        self.max_bytes = max_bytes
        self.fsync = fsync
        self.lock = threading.Lock()
        self.dropped_envelopes = 0
        self.dropped_records = 0
        self._sizes: dict[int, int] = {}
        self._records: dict[int, int] = {}
        for p in self.dir.glob("*" + SUFFIX):
            try:
                seq = int(p.name[: -len(SUFFIX)].split("-")[0])
            except ValueError:
                continue
            self._sizes[seq] = p.stat().st_size
            self._records[seq] = int(p.name[: -len(SUFFIX)].split("-")[1]) if "-" in p.name else 0
        for tmp in self.dir.glob("*.tmp"):
            tmp.unlink(missing_ok=True)  # a crash mid-write: that envelope was never sealed

    def _path(self, seq: int) -> Path:
        return self.dir / f"{seq:012d}-{self._records.get(seq, 0)}{SUFFIX}"

    @property
    def bytes(self) -> int:
        return sum(self._sizes.values())

    def __len__(self) -> int:
        return len(self._sizes)

    def max_seq(self) -> int:
        return max(self._sizes, default=-1)

    def put(self, seq: int, payload: bytes, records: int) -> None:
        with self.lock:
            self._records[seq] = records
            final = self._path(seq)
            tmp = final.with_suffix(".tmp")
            with open(tmp, "wb") as fh:
                fh.write(payload)
                if self.fsync:
                    fh.flush()
                    os.fsync(fh.fileno())
            os.replace(tmp, final)
            self._sizes[seq] = len(payload)
            while self.bytes > self.max_bytes and len(self._sizes) > 1:
                oldest = min(self._sizes)
                log.error("outbox over %d bytes: dropping envelope %d", self.max_bytes, oldest)
                self.dropped_envelopes += 1
                self.dropped_records += self._records.get(oldest, 0)
                self._remove(oldest)

    def oldest(self) -> tuple[int, bytes, int] | None:
        with self.lock:
            if not self._sizes:
                return None
            seq = min(self._sizes)
            return seq, self._path(seq).read_bytes(), self._records.get(seq, 0)

    def ack(self, seq: int) -> None:
        with self.lock:
            self._remove(seq)

    def bury(self, seq: int, why: str) -> None:
        """Move a permanently refused envelope aside, with the reason, for a human to look at."""
        with self.lock:
            path = self._path(seq)
            if path.exists():
                os.replace(path, self.dead / path.name)
                (self.dead / (path.name + ".why")).write_text(why)
            self._sizes.pop(seq, None)
            self._records.pop(seq, None)

    def _remove(self, seq: int) -> None:
        self._path(seq).unlink(missing_ok=True)
        self._sizes.pop(seq, None)
        self._records.pop(seq, None)


class AgentState:
    """Agent identity and counters that survive restarts (a small JSON file)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, object] = {}
        if path.exists():
            try:
                self.data = json.loads(path.read_text())
            except (OSError, ValueError):
                log.warning("agent state %s unreadable; starting a new stream", path)

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, sort_keys=True))
        os.replace(tmp, self.path)
