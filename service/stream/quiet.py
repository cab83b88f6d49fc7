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


class Windows:
    """Rotating windows of event time: how many ended since the last look."""

    def __init__(self, window_ns: int) -> None:
        self.window_ns = window_ns
        self.start_ns = 0  # of the current window (0: nothing seen yet)

    def passed(self, now_ns: int) -> int:
        """Windows ended by ``now_ns`` (the current one then starts where the last ended)."""
        if not self.start_ns:
            self.start_ns = now_ns
            return 0
        n = max(0, (now_ns - self.start_ns) // self.window_ns)
        self.start_ns += n * self.window_ns
        return n


class QuietGaps:
    def __init__(self, window_ns: int = WINDOW_NS, min_gaps: int = MIN_GAPS) -> None:
        self.windows = Windows(window_ns)
        self.min_gaps = min_gaps
        self.last = np.zeros(0, np.int64)  # per slot: end of its newest completed call
        self._cur = np.zeros(0, np.int64)  # per slot: longest gap in the current window
        self._prev = np.zeros(0, np.int64)  # ... and in the previous one
        self._count = np.zeros(0, np.int64)  # per slot: gaps seen

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
        passed = self.windows.passed(now_ns)
        if passed:
            self._prev = self._cur if passed == 1 else np.zeros_like(self._cur)
            self._cur = np.zeros_like(self._prev)

    def longest_s(self, slot: int) -> float:
        """The slot's longest recent gap in seconds (NaN: too few gaps seen to say)."""
        if slot >= self._count.size or self._count[slot] < self.min_gaps:
            return float("nan")
        return max(int(self._cur[slot]), int(self._prev[slot])) / 1e9


AGES_WINDOW_NS = 600_000_000_000  # event time per window of in-flight report ages


class InflightDelay:
    """How soon the job's instrumentation reports a call in flight: the youngest age
    (``sent_ns - start_ns``, one host's clock) of an in-flight record any host sent, over a
    rotating window of event time (the younger of the current and the previous window's).

    A host whose agent reports calls blocked for ``T`` seconds never sends one younger than
    ``T``; one that reports every call in flight at each flush sends some near 0. So hosts seen
    sending only calls older than ``a`` say: a call entered ``a`` before an envelope would be in
    it. The youngest of all hosts' (one host's few reports overstate its ``T`` by where in its
    flush interval they fell: with one report, by up to the interval; the job's agents share one
    setting). The hang detector's floor is at least this
    (:meth:`failslow.detectors.hang.HangDetector.floor_of`): a rank absent from its host's
    envelopes for less than this after its last completion may be inside a call not reported
    yet. None until some host sent an in-flight record."""

    NONE = 1 << 62  # no in-flight record in the window

    def __init__(self, window_ns: int = AGES_WINDOW_NS) -> None:
        self.windows = Windows(window_ns)
        self._cur = self._prev = self.NONE  # youngest age in the current / previous window

    def note(self, sent_ns: np.ndarray | int, start: np.ndarray, end: np.ndarray) -> None:
        """Collective records as sent, with their envelopes' ``sent_ns`` (one, or per record)."""
        inside = end.astype(np.int64, copy=False) == NO_END
        if not inside.any():
            return
        sent = np.broadcast_to(np.asarray(sent_ns, np.int64), inside.shape)[inside]
        age = sent - start.astype(np.int64, copy=False)[inside]
        age = age[age >= 0]  # (a start after its own host sealed the envelope: a bad record)
        if not age.size:
            return
        passed = self.windows.passed(int(np.max(sent_ns)))
        if passed:
            self._prev, self._cur = self._cur if passed == 1 else self.NONE, self.NONE
        self._cur = min(self._cur, int(age.min()))

    def delay_s(self) -> float | None:
        """The job's in-flight report delay in seconds (None: no in-flight record seen)."""
        youngest = min(self._cur, self._prev)
        return None if youngest == self.NONE else youngest / 1e9


MIN_LAG_ENVELOPES = 50  # envelopes with completions before the delivery lag is trusted


class DeliveryLag:
    """How long a completed call may stay out of what its host has sent, as measured: the
    longest ``heard - end`` of a completion over a rotating window of event time (the longer of
    the current and the previous window's), where ``heard`` is the newest ``sent_ns`` of its
    host once the envelope carrying it arrived (one host's clock; an envelope that arrives
    after a later one of its host counts from the later one's ``sent_ns``). And how far an
    envelope arrived behind its host's newer ones (``reorder_s``): an in-flight report is late
    by that much besides its own delay.

    An agent sealing every ``I`` seconds, its processes handing over every ``h``, sends a call
    up to about ``I + h`` after it ended; the longest over many envelopes approaches that. The
    hang detector's floor may then be below the configured one (instrumentation flushing every
    0.25 s: a rank absent for 0.4 s after its gap is quiet, not merely unsent;
    :func:`failslow.detectors.hang_input.measured_floor_s`). None until ``min_envelopes``
    envelopes carried a completion within the two windows: a few say little of the longest.
    A backlog (an agent that could not send for a while) lengthens it for up to two windows,
    which only makes the hang detector wait longer."""

    def __init__(
        self, window_ns: int = AGES_WINDOW_NS, min_envelopes: int = MIN_LAG_ENVELOPES
    ) -> None:
        self.windows = Windows(window_ns)
        self.min_envelopes = min_envelopes
        self._heard: dict[str, int] = {}  # per host: newest sent_ns
        self._lag = [0, 0]  # longest lag (ns) in the current / previous window
        self._reorder = [0, 0]  # longest arrival behind a newer envelope (ns), likewise
        self._count = [0, 0]  # envelopes with a completion, likewise

    def note(self, host: str, sent_ns: int, oldest_end_ns: int | None) -> None:
        """An envelope of ``host`` applied; ``oldest_end_ns``: the end of the oldest call or
        step it completed (None: it completed none)."""
        before = self._heard.get(host, 0)
        heard = self._heard[host] = max(before, sent_ns)
        passed = self.windows.passed(heard)
        if passed:
            keep = passed == 1
            self._lag = [0, self._lag[0] if keep else 0]
            self._reorder = [0, self._reorder[0] if keep else 0]
            self._count = [0, self._count[0] if keep else 0]
        self._reorder[0] = max(self._reorder[0], before - sent_ns)
        if oldest_end_ns is not None and 0 < oldest_end_ns <= sent_ns:
            self._lag[0] = max(self._lag[0], heard - oldest_end_ns)
            self._count[0] += 1

    def lag_s(self) -> float | None:
        """The longest delivery lag in seconds (None: too few envelopes to say)."""
        if sum(self._count) < self.min_envelopes:
            return None
        return max(self._lag) / 1e9

    def reorder_s(self) -> float:
        """The longest an envelope arrived behind a newer one of its host (s)."""
        return max(self._reorder) / 1e9


CADENCE_WINDOW_NS = 60_000_000_000  # event time per window of envelope gaps
MIN_CADENCE_GAPS = 10  # gaps between a host's envelopes before its longest one is trusted
UNSEEN = np.iinfo(np.int64).max  # no envelope in the window


class HostCadence:
    """How often each host sends: the longest gap between the ``sent_ns`` of consecutive
    envelopes of a host (one host's clock), and the furthest behind the job's event-time "now"
    its envelopes arrived (``now - sent_ns`` as each came: a host whose clock runs behind, or
    whose envelopes come late through a relay), each over a rotating window of event time (the
    longer of the current and the previous window's: a starting job's idle heartbeats age out).
    The hang detector takes a host silent for well over its gap, past how far behind it usually
    is, as stopped (:meth:`failslow.detectors.hang.HangDetector.silent_after_s`), not only after
    the configured ``dead_after_s``. An envelope older than its host's newest adds no gap.

    The least behind its envelopes arrived is the host's offset (:meth:`offsets_ns`): a clock
    running 2 s behind the job's makes every record of it look 2 s older than it is, and a rank
    of it quiet for 2 s longer (a stuck rank's healthy neighbour was named the hang's root). No
    record of a host is newer than its envelope, so its times moved on by the least an envelope
    came behind "now" are never ahead of the "now" it arrived at."""

    def __init__(
        self, window_ns: int = CADENCE_WINDOW_NS, min_gaps: int = MIN_CADENCE_GAPS
    ) -> None:
        self.windows = Windows(window_ns)
        self.min_gaps = min_gaps
        self._last: dict[str, int] = {}  # per host: newest sent_ns
        self._count: dict[str, int] = {}  # per host: gaps seen
        # per host: (longest gap, furthest behind, least behind) in ns, in the current and the
        # previous window
        self._cur: dict[str, tuple[int, int, int]] = {}
        self._prev: dict[str, tuple[int, int, int]] = {}

    def note(self, host: str, sent_ns: int, now_ns: int) -> None:
        """An envelope of ``host`` sealed at ``sent_ns`` arrived; ``now_ns``: the job's "now"
        before it (0: nothing heard yet)."""
        passed = self.windows.passed(max(sent_ns, now_ns))
        if passed:
            self._prev, self._cur = self._cur if passed == 1 else {}, {}
        gap0, behind0, least0 = self._cur.get(host, (0, 0, UNSEEN))
        late = max(0, now_ns - sent_ns) if now_ns else 0
        behind, least = max(behind0, late), min(least0, late) if now_ns else least0
        last = self._last.get(host)
        gap = 0
        if last is None or sent_ns > last:
            self._last[host] = sent_ns
            if last is not None:
                gap = sent_ns - last
                self._count[host] = self._count.get(host, 0) + 1
        self._cur[host] = (max(gap0, gap), behind, least)

    def _seen(self, host: str) -> tuple[int, int, int]:
        """(longest gap, furthest behind, least behind) over both windows (ns)."""
        cur, prev = self._cur.get(host, (0, 0, UNSEEN)), self._prev.get(host, (0, 0, UNSEEN))
        return max(cur[0], prev[0]), max(cur[1], prev[1]), min(cur[2], prev[2])

    def longest_s(self) -> dict[str, tuple[float, float]]:
        """Per host with enough gaps seen (and one within the two windows): its longest gap
        and the furthest behind it arrived past its offset (s)."""
        out = {}
        for host, n in self._count.items():
            gap, behind, least = self._seen(host)
            if n >= self.min_gaps and gap > 0:
                out[host] = (gap / 1e9, (behind - (least if least < UNSEEN else 0)) / 1e9)
        return out

    def offsets_ns(self) -> dict[str, int]:
        """Per host with enough gaps seen whose envelopes all came behind the job's "now": the
        least they came behind (ns), by which its times are moved on into the job's."""
        out = {}
        for host, n in self._count.items():
            least = self._seen(host)[2]
            if n >= self.min_gaps and 0 < least < UNSEEN:
                out[host] = least
        return out
