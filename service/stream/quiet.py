"""How long each rank usually goes without completing anything: its quiet gaps.

The hang detector tells a stopped rank from a slow one by the rank's own progress: a straggler
still completes its collectives in between, a stopped rank completes nothing. How long "nothing"
must last depends on the rank: a tensor-parallel rank completes an all-reduce every few
milliseconds, a data-parallel rank of a compute-bound job may compute for most of a step between
two. So per rank (slot) we keep the end of its newest completed call (the join's ``last_end``)
and the longest gap between the ends of consecutive completed calls,
over a rotating window of event time (the longest of the current and the previous window: a gap
seen in the last one or two windows, a noise spike or a checkpoint's, still counts).

Gaps are taken between ends in end order within what arrives at once and from the rank's
previous newest end; a record that arrives after a later one of its rank only makes a gap look
longer (the hang detector then waits longer), never shorter.
"""

from __future__ import annotations

import numpy as np

from failslow.wire.v2 import NO_END

WINDOW_NS = 60_000_000_000  # event time per window
MIN_GAPS = 20  # gaps a rank needs before its longest one is trusted


class QuietGaps:
    def __init__(self, window_ns: int = WINDOW_NS, min_gaps: int = MIN_GAPS) -> None:
        self.window_ns = window_ns
        self.min_gaps = min_gaps
        self.last = np.zeros(0, np.int64)  # per slot: end of its newest completed call
        self._cur = np.zeros(0, np.int64)  # per slot: longest gap in the current window
        self._prev = np.zeros(0, np.int64)  # ... and in the previous one
        self._count = np.zeros(0, np.int64)  # per slot: gaps seen
        self._window_start = 0

    def _grow(self, n: int) -> None:
        if self.last.size >= n:
            return
        for name in ("last", "_cur", "_prev", "_count"):
            old = getattr(self, name)
            new = np.zeros(n, np.int64)
            new[: old.size] = old
            setattr(self, name, new)

    def note(self, slot: np.ndarray, end: np.ndarray, n_slots: int) -> None:
        """Completed calls' ends (``NO_END``: still inside, ignored), per slot."""
        self._grow(max(n_slots, int(slot.max()) + 1 if slot.size else 0))
        done = end != NO_END
        s, e = slot[done], end[done]
        if not s.size:
            return
        order = np.lexsort((e, s))
        s, e = s[order], e[order]
        first = np.ones(s.size, bool)
        first[1:] = s[1:] != s[:-1]
        prev = np.empty_like(e)
        prev[1:] = e[:-1]
        prev[first] = self.last[s[first]]
        gap = e - prev
        gap[(prev <= 0) | (gap < 0)] = 0  # no previous end known, or out of order: no gap
        self._rotate(int(e.max()))
        heads = np.flatnonzero(first)
        ranks = s[heads]
        self._cur[ranks] = np.maximum(self._cur[ranks], np.maximum.reduceat(gap, heads))
        self._count[ranks] += np.add.reduceat((gap > 0).astype(np.int64), heads)
        tails = np.r_[heads[1:], s.size] - 1
        self.last[ranks] = np.maximum(self.last[ranks], e[tails])

    def _rotate(self, now_ns: int) -> None:
        if not self._window_start:
            self._window_start = now_ns
            return
        passed = (now_ns - self._window_start) // self.window_ns
        if passed <= 0:
            return
        self._prev = self._cur if passed == 1 else np.zeros_like(self._cur)
        self._cur = np.zeros_like(self._prev)
        self._window_start += passed * self.window_ns

    def longest_s(self, slot: int) -> float:
        """The slot's longest recent gap in seconds (NaN: too few gaps seen to say)."""
        if slot >= self._count.size or self._count[slot] < self.min_gaps:
            return float("nan")
        return max(int(self._cur[slot]), int(self._prev[slot])) / 1e9


AGES_WINDOW_NS = 600_000_000_000  # event time per window of in-flight report ages


class InflightDelay:
    """How soon the job's instrumentation reports a call in flight: the youngest age
    (``sent_ns - start_ns``, one clock) of an in-flight record it sent, over a rotating window
    of event time (the younger of the current and the previous window's).

    A host whose agent reports calls blocked for ``T`` seconds never sends one younger than
    ``T``; one that reports every call in flight at each flush sends some near 0. So a host
    seen sending only calls older than ``a`` says: a call entered ``a`` before its envelope
    would be in it. The job's delay is the youngest of all its hosts' (one host's few reports
    overstate its ``T`` by where in its flush interval they fell: with one report, by up to the
    interval; the job's agents share one setting). The hang detector's floor is at least this
    (:meth:`failslow.detectors.hang.HangDetector.floor_of`): a rank absent from its host's
    envelopes for less than this after its last completion may be inside a call not reported
    yet. None until some host sent an in-flight record."""

    def __init__(self, window_ns: int = AGES_WINDOW_NS) -> None:
        self.window_ns = window_ns
        self._cur: dict[int, int] = {}  # host id -> youngest age in the current window
        self._prev: dict[int, int] = {}
        self._window_start = 0

    def note(self, host: np.ndarray, sent_ns: np.ndarray, start: np.ndarray,
             end: np.ndarray) -> None:  # fmt: skip
        """Records as sent (per record: its host id and its envelope's ``sent_ns``)."""
        end = end.astype(np.int64, copy=False)
        inside = end == NO_END
        if not inside.any():
            return
        h, age = host[inside], sent_ns[inside] - start.astype(np.int64, copy=False)[inside]
        ok = age >= 0  # (a start after its own host sealed the envelope: a bad record)
        h, age = h[ok], age[ok]
        if not h.size:
            return
        self._rotate(int(sent_ns.max()))
        order = np.lexsort((age, h))
        h, age = h[order], age[order]
        first = np.ones(h.size, bool)
        first[1:] = h[1:] != h[:-1]
        for host_id, youngest in zip(h[first].tolist(), age[first].tolist(), strict=True):
            self._cur[host_id] = min(self._cur.get(host_id, youngest), youngest)

    def _rotate(self, now_ns: int) -> None:
        if not self._window_start:
            self._window_start = now_ns
            return
        passed = (now_ns - self._window_start) // self.window_ns
        if passed <= 0:
            return
        self._prev = self._cur if passed == 1 else {}
        self._cur = {}
        self._window_start += passed * self.window_ns

    def delay_s(self) -> float | None:
        """The job's in-flight report delay in seconds (None: no in-flight record seen)."""
        ages = [*self._cur.values(), *self._prev.values()]
        return min(ages) / 1e9 if ages else None
