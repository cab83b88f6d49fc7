"""Hang root cause: who everybody waits for, directly or transitively."""

from __future__ import annotations

from detectors.hang import BlockedCollective, HangDetector, HangSnapshot

S = 1_000_000_000
NOW = 100 * S


def blocked(
    comm: str,
    members: tuple[int, ...],
    started: dict[int, int],
    ended: dict[int, int] | None = None,
) -> BlockedCollective:
    ended = ended or {}
    return BlockedCollective(
        comm,
        7,
        members,
        tuple(started.get(m) for m in members),
        tuple(ended.get(m) for m in members),
        0.01,
    )


def snap(*b: BlockedCollective, dead: tuple[str, ...] = ()) -> HangSnapshot:
    hosts = {r: f"h{r // 4}" for r in range(16)}
    last = {f"h{i}": (NOW - 30 * S if f"h{i}" in dead else NOW) for i in range(4)}
    return HangSnapshot(NOW, b, hosts, last, NOW - 5 * S, 0.4)


def test_missing_rank_that_waits_nowhere_is_the_root() -> None:
    a = blocked("tp", (4, 5, 6, 7), {4: NOW - 5 * S, 5: NOW - 5 * S, 7: NOW - 5 * S})  # 6 missing
    b = blocked("dp", (1, 5, 9), {1: NOW - 4 * S, 9: NOW - 4 * S})  # 5 missing, but 5 waits in tp
    f = HangDetector().analyse(snap(a, b))
    assert f is not None and f.roots == (6,) and f.hosts == ("h1",)
    assert f.onset_ns == NOW - 5 * S


def test_rank_stuck_inside_an_op_its_peers_completed() -> None:
    a = blocked("tp", (0, 1), {0: NOW - 5 * S, 1: NOW - 5 * S}, {0: NOW - 5 * S + 1000})
    f = HangDetector().analyse(snap(a))
    assert f is not None and f.roots == (1,)


def test_young_collectives_are_not_hangs() -> None:
    a = blocked("tp", (0, 1), {0: NOW - S})  # 1 s: under the 2 s floor and 2 step times
    assert HangDetector().analyse(snap(a)) is None


def test_dead_host_ranks_are_roots() -> None:
    a = blocked("dp", (0, 4, 8, 12), {0: NOW - 6 * S, 4: NOW - 6 * S, 8: NOW - 6 * S})
    f = HangDetector().analyse(snap(a, dead=("h3",)))
    assert f is not None and f.roots == (12,) and "h3" in f.evidence["dead_hosts"]  # type: ignore[operator]


def test_cycle_blames_the_oldest_collectives_missing_members() -> None:
    a = blocked("x", (0, 1), {0: NOW - 9 * S})  # 1 missing, but 1 waits in y
    b = blocked("y", (1, 0), {1: NOW - 8 * S})  # 0 missing, but 0 waits in x
    f = HangDetector().analyse(snap(a, b))
    assert f is not None and f.roots == (1,) and "cycle" in f.evidence["rule"]  # type: ignore[operator]


def test_stall_without_inflight_data_needs_a_silent_host() -> None:
    quiet = HangSnapshot(NOW, (), {0: "h0", 4: "h1"}, {"h0": NOW, "h1": NOW}, NOW - 60 * S, 0.4)
    assert HangDetector().analyse(quiet) is None  # finished job, agents still heartbeating
    silent = HangSnapshot(
        NOW, (), {0: "h0", 4: "h1"}, {"h0": NOW, "h1": NOW - 60 * S}, NOW - 60 * S, 0.4
    )
    f = HangDetector().analyse(silent)
    assert f is not None and f.roots == (4,) and f.hosts == ("h1",)


def test_members_that_moved_on_mean_lost_records_not_a_hang() -> None:
    a = blocked("dp", (0, 4), {0: NOW - 20 * S})  # 4 "missing" ...
    moved_on = BlockedCollective(
        a.comm, a.seq, a.members, a.started, a.ended, a.typical_s, a.seen_ns, NOW - S
    )
    assert HangDetector().analyse(snap(moved_on)) is None  # ... but it completed later steps
    assert HangDetector().analyse(snap(a)) is not None


def test_late_records_of_a_completed_collective_are_not_a_hang() -> None:
    # ranks 0 and 1 completed it long ago; 2 and 3 have not reported: their agent lags
    a = blocked(
        "dp",
        (0, 1, 2, 3),
        {0: NOW - 20 * S, 1: NOW - 20 * S},
        {0: NOW - 20 * S + 5, 1: NOW - 20 * S + 5},
    )
    assert HangDetector().analyse(snap(a)) is None
