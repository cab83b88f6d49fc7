"""A job's event-time "now" that no single host can move.

Every envelope carries its host's ``sent_ns``: when the agent sealed the batch, on the host's
clock. The job's watermark used to be the newest ``sent_ns`` of any host, so one host whose clock
jumped (a bad NTP step) or one forged envelope moved the whole job's "now": collectives looked
blocked for an hour, frames closed before their records came, retention expired everything.

Here the watermark advances freely while an envelope's time stays within ``tolerance`` of it
(the usual case, O(1) per envelope). An envelope further ahead is held to ``tolerance`` past the
lower median of the live hosts' newest times (a host counts while it has sent within ``live_s``
of the service's wall clock), so a minority of hosts cannot move "now"; when the job as a whole
moves on (after a pause, or in a replay of history) the median follows and so does the
watermark. A host held back is flagged with how far it runs ahead of its peers. Nothing here
depends on the service's clock being close to the hosts' (replays of old data work): wall time
only decides which hosts still vote.

With one or two live hosts there is no majority to ask: the newest time counts as before (two
hosts cannot tell a jump of one from a halt of the other).
"""

from __future__ import annotations

import numpy as np

NONE = np.iinfo(np.int64).min


class EventClock:
    def __init__(self, *, tolerance_ns: int, live_s: float) -> None:
        self.tolerance_ns = tolerance_ns
        self.live_s = live_s
        self.watermark_ns = 0
        # per host id: the sent_ns of its latest envelope (latest, not largest: a host whose clock
        # was stepped back votes with its corrected clock at once)
        self._newest = np.full(16, NONE, np.int64)
        self._wall = np.zeros(16, np.float64)  # per host id: monotonic time of its last envelope
        self.ahead_ns: dict[int, int] = {}  # host id -> how far ahead of its peers, while flagged
        self.held_back = 0  # envelopes whose time was held back
        # the lower median of the live hosts, recomputed after 1/64 of them have sent again
        # (one O(hosts) partition per 1/64 round, not per envelope, while a job moves on)
        self._median = NONE
        self._median_live = 0
        self._since_median = 0

    def observe(self, host_id: int, sent_ns: int, wall: float) -> None:
        """Account for an envelope of host ``host_id`` sealed at ``sent_ns`` (received at
        monotonic ``wall``) and advance the watermark as far as the job agrees."""
        if host_id >= self._newest.size:
            grow = max(host_id + 1, 2 * self._newest.size)
            self._newest = np.concatenate(
                [self._newest, np.full(grow - self._newest.size, NONE, np.int64)]
            )
            self._wall = np.concatenate([self._wall, np.zeros(grow - self._wall.size)])
        self._newest[host_id] = sent_ns
        self._wall[host_id] = wall
        if sent_ns <= self.watermark_ns + self.tolerance_ns or self.watermark_ns == 0:
            self.watermark_ns = max(self.watermark_ns, sent_ns)
            self.ahead_ns.pop(host_id, None)
            return
        self._since_median += 1
        if self._median == NONE or self._since_median > self._median_live // 64:
            live = self._newest[(self._wall >= wall - self.live_s) & (self._newest != NONE)]
            self._median_live, self._since_median = int(live.size), 0
            k = (live.size - 1) // 2
            self._median = int(np.partition(live, k)[k]) if live.size >= 3 else NONE
        if self._median == NONE:  # fewer than three live hosts: no majority to ask
            self.watermark_ns = sent_ns
            return
        median = self._median
        bound = median + self.tolerance_ns
        if sent_ns > bound:
            self.held_back += 1
            self.ahead_ns[host_id] = sent_ns - median
        else:
            self.ahead_ns.pop(host_id, None)
        self.watermark_ns = max(self.watermark_ns, min(sent_ns, bound))

    def rebase(self, wall: float) -> None:
        """After a restore in another process (its monotonic clock differs): every known host
        counts as heard from now, and stops voting ``live_s`` later unless it sends."""
        self._wall[self._newest != NONE] = wall
        self._median = NONE

    def restore(self, watermark_ns: int) -> None:
        """The watermark a job had before a restart (its hosts vote again as they send)."""
        self.watermark_ns = max(self.watermark_ns, watermark_ns)
