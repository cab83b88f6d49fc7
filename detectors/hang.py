"""Hang detection with root cause, in event time.

A collective whose oldest member entered it longer ago than an adaptive timeout (a multiple of
its communicator's usual duration, with a floor) is blocked. The spec defines the root of a hang
as the ranks the others wait for, directly or transitively, that are not themselves waiting:

* a rank missing from a blocked collective that is not inside any blocked collective itself
  (stuck in compute, or never arrived);
* a rank stuck inside an operation its peers already completed;
* a rank whose host stopped reporting (no envelope for ``dead_after_s`` of event time).

A collective is only blocked while some member we heard from is still inside it: when every
reported member completed it, the missing members' records are merely late (a lagging agent).

A missing rank that is itself waiting in another blocked collective is followed, not blamed
(Mycroft-style dependency analysis). When in-flight records are absent altogether (an agent that
only reports completions), a job whose progress stopped while its hosts keep heartbeating is
reported with the silent hosts as roots, or with no root when none is silent.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class BlockedCollective:
    comm: str
    seq: int
    members: tuple[int, ...]  # ranks, in comm order
    started: tuple[int | None, ...]  # start_ns per member (None: never arrived)
    ended: tuple[int | None, ...]  # end_ns per member (None: still inside, or never arrived)
    typical_s: float  # usual duration of this communicator's collectives (NaN if unknown)
    seen_ns: int = 0  # event time at which the service first heard of it
    progress_ns: int = 0  # newest step end of any of its members (they moved on: not a hang)


@dataclass(frozen=True, slots=True)
class HangSnapshot:
    now_ns: int  # event-time now (newest envelope)
    blocked: tuple[BlockedCollective, ...]
    host_of_rank: dict[int, str]
    host_last_ns: dict[str, int]
    last_progress_ns: int  # end of the newest completed step or collective
    step_time_s: float  # usual step time (NaN if unknown)


@dataclass(frozen=True, slots=True)
class HangFinding:
    roots: tuple[int, ...]
    hosts: tuple[str, ...]
    onset_ns: int
    detected_ns: int  # first event time at which the evidence sufficed (replay-speed independent)
    reason: str
    evidence: dict[str, object] = field(default_factory=dict)


class HangDetector:
    def __init__(
        self,
        *,
        timeout_factor: float = 20.0,
        floor_s: float = 2.0,
        dead_after_s: float = 5.0,
        stall_factor: float = 10.0,
        stall_floor_s: float = 10.0,
        startup_s: float = 60.0,
    ) -> None:
        self.startup_s = startup_s
        self.timeout_factor = timeout_factor
        self.floor_s = floor_s
        self.dead_after_s = dead_after_s
        self.stall_factor = stall_factor
        self.stall_floor_s = stall_floor_s

    def timeout_s(self, typical_s: float, step_time_s: float = float("nan")) -> float:
        """How long a collective may take: a multiple of its usual transfer time, at least
        three step times, at least the floor (``startup_s`` for a communicator's first). A
        member that suddenly computes f times slower keeps its peers waiting about (f - 1)
        step times before the step time itself shows it, so three step times tell a straggler
        of up to ~4x from a hang."""
        floor = self.floor_s
        if step_time_s == step_time_s:
            floor = max(floor, 3.0 * step_time_s)
        if typical_s != typical_s:
            # NaN: this communicator never completed a collective. Its first one waits for the
            # last member to start (importing, loading a checkpoint) and sets up connections
            # (gloo and NCCL connect lazily): not a hang before ``startup_s``
            return max(floor, self.startup_s)
        return max(floor, self.timeout_factor * typical_s)

    def analyse(self, snap: HangSnapshot) -> HangFinding | None:
        now = snap.now_ns
        dead_hosts = sorted(
            h for h, last in snap.host_last_ns.items() if (now - last) / 1e9 > self.dead_after_s
        )
        hung = []
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
            if (now - min(starts)) / 1e9 > timeout:
                hung.append(b)
        if not hung:
            return self._stalled(snap, dead_hosts)
        waiting: set[int] = set()
        missing: set[int] = set()
        stuck_inside: set[int] = set()
        for b in hung:
            done = any(e is not None for e in b.ended)
            for rank, s, e in zip(b.members, b.started, b.ended, strict=True):
                if s is None:
                    missing.add(rank)
                elif e is None:
                    (stuck_inside if done else waiting).add(rank)
        dead_ranks = {r for r in missing | waiting if snap.host_of_rank.get(r) in dead_hosts}
        roots = (missing - waiting) | stuck_inside | dead_ranks
        how = "missing from blocked collectives and not waiting in any"
        if not roots:  # everyone waits on someone: a cycle (mismatched collectives)
            oldest = min(hung, key=lambda b: min(s for s in b.started if s is not None))
            roots = {
                r for r, s in zip(oldest.members, oldest.started, strict=True) if s is None
            } or set(oldest.members)
            how = "waiting in a cycle of blocked collectives; blaming the oldest one's missing"
            how += " members"
        onset = min(min(s for s in b.started if s is not None) for b in hung)
        # When could this have been decided? When a collective crossed its timeout, but not
        # before the service had heard of it.
        detected = min(
            max(
                min(s for s in b.started if s is not None)
                + int(self.timeout_s(b.typical_s, snap.step_time_s) * 1e9),
                b.seen_ns,
            )
            for b in hung
        )
        detected = min(max(detected, onset), now)
        hosts = tuple(sorted({snap.host_of_rank[r] for r in roots if r in snap.host_of_rank}))
        parts = []
        if missing - waiting:
            parts.append(f"rank(s) {sorted(missing - waiting)[:8]} never entered")
        if stuck_inside:
            parts.append(
                f"rank(s) {sorted(stuck_inside)[:8]} stuck inside an op their peers completed"
            )
        if dead_ranks:
            parts.append(f"host(s) {dead_hosts} stopped reporting")
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
                    "timeout_s": round(self.timeout_s(b.typical_s, snap.step_time_s), 3),
                }
                for b in sorted(hung, key=lambda b: (b.comm, b.seq))[:20]
            ],
            "dead_hosts": dead_hosts,
            "waiting_ranks": len(waiting),
            "rule": how,
        }
        return HangFinding(tuple(sorted(roots)), hosts, onset, detected, reason, evidence)

    def _stalled(self, snap: HangSnapshot, dead_hosts: list[str]) -> HangFinding | None:
        """No blocked collectives known, but no progress either (no in-flight reporting).

        Only with a silent host: a job that simply finished while its agents keep heartbeating
        must not look hung.
        """
        if not snap.last_progress_ns or not dead_hosts:
            return None
        limit = self.stall_floor_s
        if snap.step_time_s == snap.step_time_s:
            limit = max(limit, self.stall_factor * snap.step_time_s)
        idle = (snap.now_ns - snap.last_progress_ns) / 1e9
        if idle <= limit:
            return None
        roots = tuple(sorted(r for r, h in snap.host_of_rank.items() if h in dead_hosts))
        reason = f"no step or collective completed for {idle:.1f} s while hosts keep reporting"
        reason += f"; host(s) {dead_hosts} stopped reporting"
        silent_since = min(snap.host_last_ns[h] for h in dead_hosts)
        detected = min(
            snap.now_ns,
            max(
                silent_since + int(self.dead_after_s * 1e9),
                snap.last_progress_ns + int(limit * 1e9),
            ),
        )
        return HangFinding(
            roots,
            tuple(dead_hosts),
            snap.last_progress_ns,
            detected,
            reason,
            {"dead_hosts": dead_hosts, "rule": "stall"},
        )
