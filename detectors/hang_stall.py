"""A job that stopped progressing with no blocked collective known (instrumentation that
reports no call in flight): the hang detector's fallback (:mod:`.hang`)."""

from __future__ import annotations

from failslow.detectors.hang_input import HangFinding, HangSnapshot


def stalled(
    snap: HangSnapshot, dead_hosts: list[str], *, dead_after_s: float, stall_factor: float,
    stall_floor_s: float,
) -> HangFinding | None:  # fmt: skip
    """No blocked collectives known, but no progress either (no in-flight reporting): a hang
    rooted at ``dead_hosts`` (silent for ``dead_after_s``) once nothing completed for
    ``stall_factor`` step times (at least ``stall_floor_s``).

    Only with a silent host: a job that simply finished while its agents keep heartbeating
    must not look hung.
    """
    if not snap.last_progress_ns or not dead_hosts:
        return None
    limit = stall_floor_s
    if snap.step_time_s == snap.step_time_s:
        limit = max(limit, stall_factor * snap.step_time_s)
    idle = (snap.now_ns - snap.last_progress_ns) / 1e9
    if idle <= limit:
        return None
    roots = tuple(sorted(r for r, h in snap.host_of_rank.items() if h in dead_hosts))
    reason = f"no step or collective completed for {idle:.1f} s while hosts keep reporting"
    reason += f"; host(s) {dead_hosts} stopped reporting"
    silent_since = min(snap.host_last_ns[h] for h in dead_hosts)
    detected = min(
        snap.now_ns,
        max(silent_since + int(dead_after_s * 1e9), snap.last_progress_ns + int(limit * 1e9)),
    )
    return HangFinding(
        roots, tuple(dead_hosts), snap.last_progress_ns, detected, reason,
        {"dead_hosts": dead_hosts, "rule": "stall"},
    )  # fmt: skip


__all__ = ["stalled"]
