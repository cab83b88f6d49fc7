"""When a node agent seals sooner than its flush interval: a hang in the making.

A collective blocked for longer than one of its job's steps is how every hang begins (a healthy
step's calls all end within the step), and the service names a hang's root only from envelopes
that say time went on without it (``complete_ns``: docs/ingest-v1.md, "Completeness"). Waiting
for the next one-second flush then is most of the delay: on 0.4 s steps a stopped rank was named
after 2.7 steps, of which the flush interval alone was up to 2.4.

So, while a call of the agent's ranks reported in flight (``end_ns`` null) has not been seen to
end and began more than a step ago (the median of its ranks' recent step durations, ``least_s``
at least), the agent seals every ``URGENT_S``, and with nothing to send an envelope of no
records that vouches only that time went on, when its processes' marks say so. Healthy jobs pay
nothing: no call of theirs is blocked a whole step but at a checkpoint or a stall, when a few
envelopes more say what is happening. Bounded: nothing is urgent before the ranks' first step
(a job starting waits in its first collectives for as long as its slowest rank loads, and the
service gives those a minute anyway), nor once a call has been blocked for ``STALE_S`` or five
steps, whichever is longer (a hang named by then, or an end record lost): a hang of all of a
10,000-rank job's hosts costs four envelopes a second per host for that long, not for its
duration.
"""

from __future__ import annotations

from collections import deque
from statistics import median
from typing import Any

URGENT_S = 0.25  # seal interval while a call is blocked for longer than a step
MAX_OPEN = 4096  # in-flight calls remembered (a bound, not a working set: a job's ranks x comms)
# a call blocked this long (or five steps) is no longer news: the agent goes back to its flush
# interval
STALE_S = 10.0
STALE_STEPS = 5


class Urgency:
    def __init__(self, *, least_s: float = 0.25, steps_kept: int = 64) -> None:
        self.least_ns = int(least_s * 1e9)
        self._open: dict[tuple[Any, Any, Any], int] = {}  # (rank, comm, seq) -> start_ns
        self._steps: deque[int] = deque(maxlen=steps_kept)  # recent step durations, ns
        self._step_ns: int | None = None

    def collective(self, rec: dict[str, Any]) -> None:
        """A collective record as taken into a batch (in flight or ended)."""
        key = (rec["rank"], rec["comm"], rec["seq"])
        if rec["end_ns"] is None:
            if len(self._open) >= MAX_OPEN:
                self._open.pop(next(iter(self._open)))  # the oldest reported
            self._open[key] = int(rec["start_ns"])
        elif self._open:
            self._open.pop(key, None)

    def step(self, rec: dict[str, Any]) -> None:
        start, end = rec.get("start_ns"), rec.get("end_ns")
        if isinstance(start, int) and isinstance(end, int) and end > start:
            self._steps.append(end - start)
            self._step_ns = None

    def step_ns(self) -> int | None:
        """How long a call may be blocked before it is news (None: no step known yet)."""
        if not self._steps:
            return None
        if self._step_ns is None:
            self._step_ns = int(median(self._steps))
        return max(self.least_ns, self._step_ns)

    def due(self, now_ns: int) -> bool:
        """A call reported in flight and not seen to end began more than a step before
        ``now_ns`` (the records' clock: this host's wall clock), and not too long ago."""
        step = self.step_ns()
        if not self._open or step is None:
            return False
        stale = now_ns - max(int(STALE_S * 1e9), STALE_STEPS * step)
        if min(self._open.values()) < stale:
            self._open = {k: v for k, v in self._open.items() if v >= stale}
        return bool(self._open) and now_ns - min(self._open.values()) > step


__all__ = ["MAX_OPEN", "STALE_S", "STALE_STEPS", "URGENT_S", "Urgency"]
