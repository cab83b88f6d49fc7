"""Hang detection with root cause, in event time.

A collective whose oldest member entered it longer ago than an adaptive timeout (a multiple of
its communicator's usual duration, with a floor) is blocked. The spec defines the root of a hang
as the ranks the others wait for, directly or transitively, that are not themselves waiting:

* a rank missing from a blocked collective that is not inside any blocked collective itself
  (stuck in compute, or never arrived);
* a rank stuck inside an operation its peers already completed;
* a rank whose host stopped reporting (no envelope for ``SILENCE_FACTOR`` times the host's own
  longest recent gap between envelopes, at most ``dead_after_s``, of event time).

Roots are sinks only: a rank in flight in any blocked collective or p2p that waits for another
rank is followed, never blamed. A missing rank is quiet only as far as its host has reported: a
host whose envelopes lag behind the others has not yet said what its ranks did since.

A collective is only blocked while some member we heard from is still inside it: when every
reported member completed it, the missing members' records are merely late (a lagging agent).

A missing rank that is itself waiting in another blocked collective (timed out or not) is
followed, not blamed (Mycroft-style dependency analysis). A rank so reached is a root only if it
has completed nothing (no collective, no step) for the timeout too: a straggler that computes
several times slower than its peers keeps them waiting for seconds, but it still finishes its
own collectives in between, which a stopped or stuck rank does not. When every rank reached that
way is still progressing, there is no hang (the peer detectors report the straggler).

A collective blocked for only ``suspect_steps`` step times (not the full three) is hung when the
ranks it waits for have completed nothing for ``quiet_factor`` times their own longest recent gap
between two completed calls (``HangSnapshot.rank_gap_s``; within the floor and the full timeout):
a straggler f times slower stretches its gaps f times and keeps completing calls, a stopped rank
completes none. A tensor-parallel rank's gaps are milliseconds, so its hang is named after about
a step; a data-parallel rank of a compute-bound job with one all-reduce per step has gaps of a
step, and the full timeout decides. Ranks whose gaps are unknown wait for the full timeout.

The floor of the suspect and quiet timeouts is the configured one, lowered to how late the job's
instrumentation sends a completed call as measured from its envelopes
(``HangSnapshot.delivery_lag_s``), and raised to its in-flight report delay as measured from its
records where that is longer (``HangSnapshot.inflight_after_s``): with instrumentation that
reports a call in flight only after seconds, ranks waiting in a call not reported yet were
blamed besides the stopped one.

Where a host vouches for what it sent (``complete_ns``, ``inflight_after_ns``: docs/ingest-v1.md,
"Completeness"), a missing rank is also judged by its quiet up to ``complete_ns``, with the
announced in-flight delay as the floor after its gap; either judgement may name it, and where
every host vouches, the suspect timeout's floor is the announced delay too. A host whose vouch
stops advancing (its process frozen with the rank) leaves the unvouched judgement.

The clock of a member still inside a collective that its peers completed starts at their
completion, not at its entry: until then its own end record may merely lag behind theirs.

When in-flight records are absent altogether (an agent that only reports completions), a job
whose progress stopped while its hosts keep heartbeating is reported with the silent hosts as
roots, or with no root when none is silent.
"""

from __future__ import annotations

from failslow.detectors.defaults import DEFAULTS
from failslow.detectors.hang_input import (
    MIN_SILENCE_S,
    MIN_VOUCHED_FLOOR_S,
    SILENCE_FACTOR,
    BlockedCollective,
    HangFinding,
    HangSnapshot,
    measured_floor_s,
)
from failslow.detectors.hang_stall import stalled


class HangDetector:
    def __init__(
        self,
        *,
        timeout_factor: float = 20.0,
        floor_s: float = DEFAULTS.hang_floor_s,
        dead_after_s: float = DEFAULTS.dead_after_s,
        stall_factor: float = 10.0,
        stall_floor_s: float = 10.0,
        startup_s: float = DEFAULTS.hang_startup_s,
        quiet_factor: float = DEFAULTS.hang_quiet_factor,
        suspect_steps: float = DEFAULTS.hang_suspect_steps,
    ) -> None:
        self.quiet_factor = quiet_factor
        self.suspect_steps = suspect_steps
        self.startup_s = startup_s
        self.timeout_factor = timeout_factor
        self.floor_s = floor_s
        self.dead_after_s = dead_after_s
        self.stall_factor = stall_factor
        self.stall_floor_s = stall_floor_s

    def timeout_s(
        self, typical_s: float, step_time_s: float = float("nan"), steps: float = 3.0,
        floor_s: float | None = None,
    ) -> float:
        """How long a collective may take: a multiple of its usual transfer time, at least
        ``steps`` step times, at least the floor (``startup_s`` for a communicator's first). A
        member that suddenly computes f times slower keeps its peers waiting about (f - 1)
        step times before the step time itself shows it, so three step times tell a straggler
        of up to ~4x from a hang without looking at the member itself; ``suspect_steps`` do
        when the member's own quiet gaps are known (:meth:`rank_timeout_s`). ``floor_s``:
        another floor than the configured one (:meth:`floor_of`)."""
        floor = self.floor_s if floor_s is None else floor_s
        if step_time_s == step_time_s:
            floor = max(floor, steps * step_time_s)
        if typical_s != typical_s:
            # NaN: this communicator never completed a collective. Its first one waits for the
            # last member to start (importing, loading a checkpoint) and sets up connections
            # (gloo and NCCL connect lazily): not a hang before ``startup_s``
            return max(floor, self.startup_s)
        return max(floor, self.timeout_factor * typical_s)

    def floor_of(self, snap: HangSnapshot) -> float:
        """The floor of the suspect and quiet timeouts (:func:`measured_floor_s`): the configured
        one, lowered to the job's measured delivery lag of completions (instrumentation sending
        every 0.25 s: a rank absent for 0.3 s after its longest gap has completed nothing, it
        is not merely unsent), and never below its measured in-flight report delay
        (instrumentation that reports a call in flight only after 5 s: a rank absent from its
        host's envelopes for less than that after its last completion may be inside a call not
        reported yet). The configured floor holds while neither is known; the full timeout
        keeps it always."""
        return measured_floor_s(
            self.floor_s, snap.delivery_lag_s, snap.inflight_after_s, snap.reorder_s
        )

    def cut_floor(self, snap: HangSnapshot) -> float:
        """The floor of the suspect timeout: :meth:`floor_of`, or where every host vouches for
        what it sent (``complete_ns``, ``inflight_after_ns``: neither lag is unknown) the
        longest in-flight delay they announced (at least ``MIN_VOUCHED_FLOOR_S``): a collective
        blocked that long has its missing members judged by their quiet, as vouched for."""
        vouched = snap.vouched_floor_s
        return self.floor_of(snap) if vouched is None else vouched

    def silent_after_s(self, snap: HangSnapshot, host: str) -> float:
        """How long ``host`` may send nothing while others do before its ranks count as
        stopped with it: ``SILENCE_FACTOR`` times its own longest recent gap between envelopes,
        plus the furthest behind the job's "now" its envelopes arrived past its clock's offset
        (a relay, a late agent; the snapshot's times of a host are moved on by that offset), at
        most ``dead_after_s`` (which holds where its cadence is unknown). Only
        ranks that blocked collectives wait for are named so: a host whose agent is merely late
        has ranks that complete their collectives with their peers."""
        cadence = snap.host_cadence_s.get(host)
        if cadence is None:
            return self.dead_after_s
        gap, behind = cadence
        return min(self.dead_after_s, max(MIN_SILENCE_S, SILENCE_FACTOR * gap + behind))

    def rank_timeout_s(self, gap_s: float, full_s: float, floor_s: float | None = None) -> float:
        """How long a rank may complete nothing: ``quiet_factor`` times its longest recent gap
        between two completed calls (a straggler f times slower stretches its gaps f times,
        and still completes calls in between), at most the full timeout; at least the floor
        after its longest gap: a rank that computed for up to that gap, then entered an op it
        still waits in, is reported inside it only after the agents' in-flight delay (the
        floor). A 10x straggler otherwise had the ranks waiting for it in a data-parallel
        all-reduce, not yet reported, blamed."""
        floor = self.floor_s if floor_s is None else floor_s
        return max(floor + gap_s, min(full_s, self.quiet_factor * gap_s))

    def _vouched_quiet(self, snap: HangSnapshot, rank: int, host: str, last_end: dict[int, int],
                       gap: float, timeout: float) -> tuple[float, float] | None:  # fmt: skip
        """(quiet, limit) of a rank as far as its host vouched for what it sent (None: it did
        not): quiet up to its ``complete_ns``, the floor after its gap its own in-flight delay.
        Either this or the unvouched judgement may name it: each is sound on its own, and a
        host that stopped vouching (its process frozen with the rank) leaves the other."""
        vouch = snap.host_vouch.get(host)
        if vouch is None:
            return None
        complete, after = vouch
        quiet = (min(snap.now_ns, complete) - last_end.get(rank, 0)) / 1e9
        return quiet, self.rank_timeout_s(gap, timeout, max(MIN_VOUCHED_FLOOR_S, after))

    def analyse(self, snap: HangSnapshot) -> HangFinding | None:
        now = snap.now_ns
        # hosts silent for longer than their own cadence allows: their ranks stopped with them
        # (host -> when its silence sufficed); those silent past dead_after_s (never more than
        # the cadence allows) also root the stall rule
        silent: dict[str, int] = {}
        for h, last in snap.host_last_ns.items():
            limit = self.silent_after_s(snap, h)
            if (now - last) / 1e9 > limit:
                silent[h] = last + int(limit * 1e9)
        dead_hosts = sorted(
            h for h in silent if (now - snap.host_last_ns[h]) / 1e9 > self.dead_after_s
        )
        dead = set(silent)
        live: list[tuple[BlockedCollective, float]] = []  # someone is still inside
        hung: list[tuple[BlockedCollective, float]] = []  # past the full timeout ...
        suspect: list[tuple[BlockedCollective, float]] = []  # ... past the suspect one
        cuts: dict[int, float] = {}  # id of a collective -> its suspect timeout
        floor, cut_floor = self.floor_of(snap), self.cut_floor(snap)
        for b in snap.blocked:
            starts = [s for s in b.started if s is not None]
            if not starts:
                continue
            if not any(
                s is not None and e is None for s, e in zip(b.started, b.ended, strict=True)
            ):
                # every member we heard from completed it: the others' records are late (an
                # agent lagging behind), nobody is stuck inside it
                continue
            timeout = self.timeout_s(b.typical_s, snap.step_time_s)
            if b.progress_ns > min(starts) + timeout * 1e9:
                continue  # a member finished later steps: records went missing, nobody is stuck
            live.append((b, timeout))
            waited = (now - b.waiting_since()) / 1e9
            cut = self.timeout_s(b.typical_s, snap.step_time_s, self.suspect_steps, cut_floor)
            cuts[id(b)] = cut
            if waited > timeout:
                hung.append((b, timeout))
            elif waited > cut:
                suspect.append((b, timeout))  # decided by its missing members' own quiet
        full = {id(b) for b, _ in hung}
        hung += suspect
        if not hung:
            return stalled(snap, dead_hosts, dead_after_s=self.dead_after_s,
                           stall_factor=self.stall_factor, stall_floor_s=self.stall_floor_s)
        # Where each rank waits: collectives it is inside that none of its peers completed. A
        # rank inside one its peers did complete finished it with them (collectives end
        # together), its own end record is on its way: that counts as progress, when they ended
        # (in every collective given, also those a member's later steps passed over).
        waits_in: dict[int, list[BlockedCollective]] = {}
        last_end = dict(snap.rank_last_end)
        live_ids = {id(b) for b, _ in live}
        for b in snap.blocked:
            ends = [e for e in b.ended if e is not None]
            for rank, s, e in zip(b.members, b.started, b.ended, strict=True):
                if s is None or e is not None:
                    continue
                if ends:
                    last_end[rank] = max(last_end.get(rank, 0), max(ends))
                elif id(b) in live_ids:
                    waits_in.setdefault(rank, []).append(b)
        # Follow the wait-for edges from the hung collectives to the ranks that wait nowhere.
        # A collective past only the suspect timeout blames nobody by itself: its missing
        # members are roots when they have been quiet for longer than their own gaps allow.
        todo: list[tuple[int, float, bool]] = []  # (rank, timeout, reached from a full one)
        stuck_inside: set[int] = set()
        dead_ranks: set[int] = set()
        waiting = 0
        pending: dict[int, float] = {}  # inside one its peers completed, its end not sent yet
        for b, timeout in hung:
            done = max((e for e in b.ended if e is not None), default=0)
            sure = id(b) in full
            for rank, s, e in zip(b.members, b.started, b.ended, strict=True):
                if s is None:
                    todo.append((rank, timeout, sure))
                elif e is None:
                    if snap.host_of_rank.get(rank) in dead:
                        dead_ranks.add(rank)
                    elif done and sure:
                        # inside one its peers completed: stuck once its host has reported
                        # since they did (before, its end record is merely not sent yet: a 5x
                        # straggler's peers, on 1 s batches, were named a hang)
                        if snap.reported_since(rank, done, floor):
                            stuck_inside.add(rank)
                        else:  # progress as far as we know: none reported since
                            pending[rank] = round((now - done) / 1e9, 3)
                    else:
                        waiting += 1
        # Roots are sinks only: a rank still inside an op its peers completed, that is also in
        # flight in another blocked op waiting for a rank that never arrived, waits itself
        # (issue 16: a pipeline rank in a data-parallel all-reduce whose peer had finished it,
        # while it waited for a stopped neighbour): follow it, do not blame it.
        for rank in sorted(stuck_inside):
            if rank in waits_in:
                stuck_inside.discard(rank)
                todo.append((rank, max(t for _, t in hung), True))
        missing: dict[int, float] = {}  # root -> the timeout it was held to
        progressing: dict[int, float] = dict(pending)
        undecided: set[int] = set()  # quiet gaps unknown, reached from suspect collectives only
        by_gap: set[int] = set()  # ranks judged by their own quiet gaps
        seen: dict[int, bool] = {}  # rank -> reached from a full one
        todo.sort(key=lambda t: t[2])  # popped from the end: the full ones' first
        while todo:
            rank, timeout, sure = todo.pop()
            if rank in seen and (seen[rank] or not sure):
                continue
            seen[rank] = sure
            progressing.pop(rank, None)
            undecided.discard(rank)
            if snap.host_of_rank.get(rank) in dead:
                dead_ranks.add(rank)
                continue
            if rank in waits_in:  # it waits for others itself: follow them, do not blame it
                for b in waits_in[rank]:
                    todo.extend(
                        (r, timeout, sure)
                        for r, s in zip(b.members, b.started, strict=True)
                        if s is None
                    )
                continue
            # Quiet for how long, as far as its host has told us: a host whose envelopes lag
            # (a busy agent) has not yet said what the rank did since, so it is not blamed yet.
            host = snap.host_of_rank.get(rank, "")
            heard = snap.host_last_ns.get(host, now)
            quiet_s = (min(now, heard) - last_end.get(rank, 0)) / 1e9
            gap = snap.rank_gap_s.get(rank, float("nan"))
            if gap == gap:
                limit = self.rank_timeout_s(gap, timeout, floor)
                by_gap.add(rank)
                vouched = self._vouched_quiet(snap, rank, host, last_end, gap, timeout)
                # either judgement may name it; where both do, the one that could decide
                # sooner dates it (a pass that comes late must not date it later)
                if (vouched is not None and vouched[0] > vouched[1]
                        and (quiet_s <= limit or vouched[1] < limit)):  # fmt: skip
                    quiet_s, limit = vouched
            elif sure:
                limit = timeout
            else:
                undecided.add(rank)
                continue
            if quiet_s > limit:
                missing[rank] = limit
            else:  # it completed work within the timeout: slow, not hung
                progressing[rank] = round(quiet_s, 3)
        roots = set(missing) | stuck_inside | dead_ranks
        how = "missing from blocked collectives and not waiting in any"
        if not roots:
            if progressing or undecided or not full:
                # Everyone the blocked ranks wait for still completes collectives or steps: a
                # straggler holds them up (the peer detectors report it), nobody is stuck.
                return None
            # everyone waits on someone: a cycle (mismatched collectives)
            oldest = min(
                (b for b, _ in hung if id(b) in full),
                key=lambda b: min(s for s in b.started if s is not None),
            )
            roots = {
                r for r, s in zip(oldest.members, oldest.started, strict=True) if s is None
            } or set(oldest.members)
            how = "waiting in a cycle of blocked collectives; blaming the oldest one's missing"
            how += " members"
        onset = min(min(s for s in b.started if s is not None) for b, _ in hung)
        # When could this have been decided? When a collective crossed its timeout, but not
        # before the service had heard of it, nor before its roots had been quiet that long.
        # The suspect timeout sufficed where only ranks judged by their own gaps are blamed.
        gaps_decide = bool(missing) and not (stuck_inside or dead_ranks) and by_gap >= set(missing)
        crossed = {
            id(b): cuts[id(b)] if gaps_decide or id(b) not in full else timeout
            for b, timeout in hung
        }
        detected = min(
            max(b.waiting_since() + int(crossed[id(b)] * 1e9), b.seen_ns) for b, _ in hung
        )
        if not stuck_inside:  # and not before the first root's own evidence sufficed
            enough = [last_end.get(r, 0) + int(t * 1e9) for r, t in missing.items()]
            enough += [silent[snap.host_of_rank[r]] for r in dead_ranks]
            if enough:  # (none: a cycle, decided when its collective crossed the timeout)
                detected = max(detected, min(enough))
        detected = min(max(detected, onset), now)
        hosts = tuple(sorted({snap.host_of_rank[r] for r in roots if r in snap.host_of_rank}))
        parts = []
        if missing:
            parts.append(f"rank(s) {sorted(missing)[:8]} never entered")
        if stuck_inside:
            parts.append(
                f"rank(s) {sorted(stuck_inside)[:8]} stuck inside an op their peers completed"
            )
        if dead_ranks:
            stopped = sorted({snap.host_of_rank[r] for r in dead_ranks})
            parts.append(f"host(s) {stopped[:8]} stopped reporting")
        reason = (
            f"{len(hung)} collective(s) blocked for up to {(now - onset) / 1e9:.1f} s; "
            + "; ".join(parts or [how])
        )
        evidence = {
            "blocked": [
                {
                    "comm": b.comm,
                    "seq": b.seq,
                    "waiting": sum(
                        1
                        for s, e in zip(b.started, b.ended, strict=True)
                        if s is not None and e is None
                    ),
                    "missing": [r for r, s in zip(b.members, b.started, strict=True) if s is None][
                        :16
                    ],
                    "timeout_s": round(crossed[id(b)], 3),
                }
                for b, timeout in sorted(hung, key=lambda x: (x[0].comm, x[0].seq))[:20]
            ],
            "dead_hosts": sorted(silent),
            "waiting_ranks": waiting,
            "progressing": dict(sorted(progressing.items())[:16]),
            "rule": how,
        }
        return HangFinding(tuple(sorted(roots)), hosts, onset, detected, reason, evidence)


__all__ = ["BlockedCollective", "HangDetector", "HangFinding", "HangSnapshot"]
