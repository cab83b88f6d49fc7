"""The agent's durable outbox: one gzip file per sealed envelope, delivered in order.

Files are named by batch sequence number, written to a temporary name, fsynced and renamed, so
a crash leaves either a whole envelope or none. Total size is bounded; past the bound the
oldest envelopes are dropped and counted (an unbounded disk is worse than a loud gap).

When the disk cannot take an envelope (full, read-only, gone), it is kept in memory instead,
bounded by ``max_memory_bytes`` (the oldest dropped and counted past it), delivered from there
like the others, and written to disk as soon as the disk takes it again. Nothing is lost without
being counted, and a full disk never stops the agent.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from pathlib import Path

log = logging.getLogger(__name__)

SUFFIX = ".json.gz"


class Outbox:
    def __init__(
        self,
        directory: Path,
        *,
        max_bytes: int = 1 << 30,
        fsync: bool = True,
        max_memory_bytes: int = 256 << 20,
    ) -> None:
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
        self.max_memory_bytes = max_memory_bytes
        self._memory: dict[int, bytes] = {}  # envelopes the disk did not take (yet)
        self.disk_errors = 0  # writes that failed (the envelope went to memory)
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

    @property
    def memory_bytes(self) -> int:
        return sum(len(p) for p in self._memory.values())

    def in_memory(self) -> int:
        return len(self._memory)

    def __len__(self) -> int:
        return len(self._sizes)

    def max_seq(self) -> int:
        return max(self._sizes, default=-1)

    def put(self, seq: int, payload: bytes, records: int) -> None:
        """Keep an envelope: on disk, or in memory while the disk does not take it."""
        with self.lock:
            self._records[seq] = records
            self._sizes[seq] = len(payload)
            if self._memory or not self._write(seq, payload):  # keep the order: disk after memory
                self._memory[seq] = payload
                self._bound_memory()
            self._bound()

    def spill(self) -> int:
        """Write what waits in memory to disk, oldest first, while the disk takes it; the
        number written."""
        done = 0
        with self.lock:
            for seq in sorted(self._memory):
                if not self._write(seq, self._memory[seq]):
                    break
                del self._memory[seq]
                done += 1
        if done:
            log.warning("outbox: the disk takes envelopes again; %d moved from memory", done)
        return done

    def _write(self, seq: int, payload: bytes) -> bool:
        final = self._path(seq)
        tmp = final.with_suffix(".tmp")
        try:
            with open(tmp, "wb") as fh:
                fh.write(payload)
                if self.fsync:
                    fh.flush()
                    os.fsync(fh.fileno())
            os.replace(tmp, final)
            return True
        except OSError as exc:
            self.disk_errors += 1
            if self.disk_errors == 1 or self.disk_errors % 100 == 0:
                log.error("outbox: cannot write envelope %d (%s); kept in memory", seq, exc)
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            return False

    def _drop(self, seq: int, why: str) -> None:
        log.error("outbox %s: dropping envelope %d", why, seq)
        self.dropped_envelopes += 1
        self.dropped_records += self._records.get(seq, 0)
        self._remove(seq)

    def _bound(self) -> None:
        while self.bytes > self.max_bytes and len(self._sizes) > 1:
            self._drop(min(self._sizes), f"over {self.max_bytes} bytes")

    def _bound_memory(self) -> None:
        while self.memory_bytes > self.max_memory_bytes and len(self._memory) > 1:
            self._drop(min(self._memory), f"memory over {self.max_memory_bytes} bytes")

    def oldest(self) -> tuple[int, bytes, int] | None:
        with self.lock:
            if not self._sizes:
                return None
            seq = min(self._sizes)
            payload = self._memory.get(seq)
            if payload is None:
                payload = self._path(seq).read_bytes()
            return seq, payload, self._records.get(seq, 0)

    def ack(self, seq: int) -> None:
        with self.lock:
            self._remove(seq)

    def bury(self, seq: int, why: str) -> None:
        """Move a permanently refused envelope aside, with the reason, for a human to look at."""
        with self.lock:
            path = self._path(seq)
            held = self._memory.pop(seq, None)
            try:
                if held is not None:
                    (self.dead / path.name).write_bytes(held)
                elif path.exists():
                    os.replace(path, self.dead / path.name)
                (self.dead / (path.name + ".why")).write_text(why)
            except OSError as exc:  # counted by the caller either way
                log.error("outbox: cannot keep refused envelope %d in %s (%s)", seq, self.dead, exc)
            self._sizes.pop(seq, None)
            self._records.pop(seq, None)

    def _remove(self, seq: int) -> None:
        if self._memory.pop(seq, None) is None:
            with contextlib.suppress(OSError):
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
