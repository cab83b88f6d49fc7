"""What a node agent's envelopes vouch for (docs/ingest-v1.md, "Completeness"): ``complete_ns``
— every call and step of its ranks that ended by then is in this envelope or an earlier one —
and ``inflight_after_ns`` — every call begun that long before it and not ended was sent in
flight.

The agent vouches only for what its sources vouched for: each SDK process ends every hand-over
with a mark, ``["w", complete_ns, inflight_after_ns]`` (the torch instrumentation's
``CallTimer.watermark``), after that hand-over's records. An envelope sealed now carries every
record handed over before each process's newest mark, so it vouches for the oldest of them. It
vouches for nothing while a process that sent anything in the last ``WINDOW_S`` has sent no mark
(an older SDK, an instrumentation of its own) or a source without marks fed the agent (NCCL
Inspector, Flight Recorder files): the service then judges as it would without (never worse).
A process that exits stops marking; it holds the others' mark back for ``WINDOW_S``, no longer.
"""

from __future__ import annotations

import time
from typing import Any

WINDOW_S = 10.0
MARK = "w"


class Vouches:
    def __init__(self, clock: Any = time.monotonic) -> None:
        self.clock = clock
        self._seen: dict[int, float] = {}  # pid -> when it last handed anything over
        self._marks: dict[int, tuple[int, int]] = {}  # pid -> its newest mark
        self._unmarked_at = float("-inf")  # records from a source that never marks

    def note(self, pid: int | None, *, records: bool, mark: tuple[int, int] | None) -> None:
        """A hand-over of process ``pid`` (None: a source that does not mark), after its
        records (``records``: it had some) were taken into the batch; ``mark``: its
        ``(complete_ns, inflight_after_ns)``, if it ended with one."""
        now = self.clock()
        if pid is None:
            if records:
                self._unmarked_at = now
            return
        self._seen[pid] = now
        if mark is not None:
            old = self._marks.get(pid)
            self._marks[pid] = (max(mark[0], old[0]) if old else mark[0], mark[1])

    def current(self, sent_ns: int) -> dict[str, int]:
        """The fields of an envelope sealed now (none, when it cannot vouch); ``complete_ns``
        never after ``sent_ns``."""
        now = self.clock()
        if now - self._unmarked_at < WINDOW_S:
            return {}
        for pid in [p for p, t in self._seen.items() if now - t >= WINDOW_S]:
            del self._seen[pid]
            self._marks.pop(pid, None)
        marks = [self._marks.get(p) for p in self._seen]
        if not marks or any(m is None for m in marks):
            return {}
        return {"complete_ns": min(min(m[0] for m in marks if m), sent_ns),
                "inflight_after_ns": max(m[1] for m in marks if m)}  # fmt: skip


__all__ = ["MARK", "Vouches", "WINDOW_S"]
