"""Hang root cause: who everybody waits for, directly or transitively."""

from __future__ import annotations

from dataclasses import replace

from failslow.detectors.hang import BlockedCollective, HangDetector, HangSnapshot
from failslow.detectors.hang_input import LAG_MARGIN, MIN_VOUCHED_FLOOR_S, measured_floor_s

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


def snap(
    *b: BlockedCollective, dead: tuple[str, ...] = (), last_end: dict[int, int] | None = None
) -> HangSnapshot:
    hosts = {r: f"h{r // 4}" for r in range(16)}
    last = {f"h{i}": (NOW - 30 * S if f"h{i}" in dead else NOW) for i in range(4)}
    return HangSnapshot(NOW, b, hosts, last, NOW - 5 * S, 0.4, last_end or {})


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


def test_roots_are_sinks_a_rank_that_waits_for_another_is_never_one() -> None:
    """Issue 16: 2 is still inside a data-parallel all-reduce its peer 0 completed, and in flight
    in a p2p receive from 3, which never sent (stopped): 2 waits, 3 is the only root."""
    dp = blocked("dp", (0, 2), {0: NOW - 6 * S, 2: NOW - 6 * S}, {0: NOW - 6 * S + 1000})
    p2p = blocked("p2p-2-3", (2, 3), {2: NOW - 5 * S})  # 3 never entered its send
    f = HangDetector().analyse(snap(dp, p2p, last_end={3: NOW - 6 * S}))
    assert f is not None and f.roots == (3,), f


def test_a_member_whose_peers_just_completed_is_not_stuck_yet() -> None:
    # (a 2 s floor, the default until issue 32) 1 waited 3 s for 0, who arrived and finished
    # 1.5 s ago: 1's own end record may still be
    # on its way (the clock starts at the peers' completion, not at 1's entry)
    a = blocked("dp", (0, 1), {0: NOW - 2 * S, 1: NOW - 3 * S}, {0: NOW - 3 * S // 2})
    hd = HangDetector(floor_s=2.0)
    assert hd.analyse(snap(a)) is None
    later = HangSnapshot(NOW + S, (a,), {0: "h0", 1: "h0"}, {"h0": NOW + S}, NOW - 5 * S, 0.4)
    f = hd.analyse(later)  # 2.5 s after the peers: past the 2 s floor
    assert f is not None and f.roots == (1,) and "stuck inside" in f.reason
    assert f.detected_ns == NOW - 3 * S // 2 + 2 * S


def test_inside_one_its_peers_completed_is_stuck_only_once_its_host_reported_since() -> None:
    """4 is inside an all-reduce 0 completed 0.9 s ago; 4's host (h1) sends every second and
    last sent (and vouched for what it had) 1 s ago: 4's end record is not sent yet. Once h1
    has sent an envelope more than the floor after the peers' end, 4 is stuck inside it (not
    sooner for vouching: the hosts' clocks are moved onto each other within a batch)."""
    a = blocked("dp", (0, 4), {0: NOW - 3 * S, 4: NOW - 3 * S}, {0: NOW - 9 * S // 10})
    hosts = {0: "h0", 4: "h1"}
    base = HangSnapshot(NOW, (a,), hosts, {"h0": NOW, "h1": NOW - S}, NOW - 5 * S, 0.2)
    sent_before = replace(base, host_vouch={"h0": (NOW, 0.25), "h1": (NOW - S, 0.25)})
    hd = HangDetector(floor_s=0.5)
    assert hd.analyse(sent_before) is None
    assert hd.analyse(base) is None  # not vouching: 1 s ago is before the peers' end too
    vouched_since = replace(sent_before, host_vouch={"h0": (NOW, 0.25), "h1": (NOW, 0.25)})
    f = hd.analyse(replace(vouched_since, host_last_ns={"h0": NOW, "h1": NOW}))
    assert f is not None and f.roots == (4,) and "stuck inside" in f.reason
    soon = replace(vouched_since, host_last_ns={"h0": NOW, "h1": NOW - S // 2})
    assert hd.analyse(soon) is None  # sent 0.4 s after the peers' end: within the floor
    f = hd.analyse(replace(base, host_last_ns={"h0": NOW, "h1": NOW}))  # 0.9 s > the floor
    assert f is not None and f.roots == (4,) and "stuck inside" in f.reason


def test_peers_completion_is_progress_in_a_collective_later_steps_passed_over() -> None:
    """13 is inside dp seq 30, which its peers completed 0.9 s ago (its end record on its way),
    and missing from seq 31, whose other member 9 is a straggler. A member's later step end
    takes seq 30 out of the live ones; 13's progress at its peers' completion still counts:
    not quiet, no hang (a 5x straggler's dp peers were named a hang on 1 s batches)."""
    done = NOW - 9 * S // 10
    s30 = replace(
        blocked("dp", (9, 13), {9: NOW - 2 * S, 13: NOW - 2 * S}, {9: done}),
        progress_ns=NOW - S // 2,  # 9 ended its step since: seq 30 is no longer live
    )
    s31 = blocked("dp", (9, 13), {})
    s31 = replace(s31, started=(None, None), seq=8)
    other = blocked("tp", (12, 13), {12: NOW - 2 * S})  # 12 waits for 13 in tp
    hosts = {9: "h2", 12: "h3", 13: "h3"}
    gaps = {9: 0.1, 12: 0.1, 13: 0.1}
    base = HangSnapshot(
        NOW, (s30, s31, other), hosts, {"h2": NOW, "h3": NOW - S}, NOW - 5 * S, 0.4,
        {9: NOW - S // 10, 12: NOW - 2 * S, 13: NOW - 2 * S}, gaps,
    )  # fmt: skip
    assert HangDetector(floor_s=0.5).analyse(base) is None


def test_a_straggler_that_still_completes_work_is_not_a_hang() -> None:
    # (a 2 s floor) 3 has waited 2.5 s in dp for 1, which computes slowly but finished a tp
    # collective 0.6 s ago
    hd = HangDetector(floor_s=2.0)
    a = blocked("dp", (1, 3), {3: NOW - 5 * S // 2})
    assert hd.analyse(snap(a, last_end={1: NOW - 6 * S // 10})) is None
    f = hd.analyse(snap(a, last_end={1: NOW - 7 * S // 2}))  # quiet for 3.5 s
    assert f is not None and f.roots == (1,)
    assert f.detected_ns == NOW - S // 2  # when dp passed the 2 s floor (1 was quiet by then)
    f = hd.analyse(snap(a, last_end={1: NOW - 22 * S // 10}))
    assert f is not None and f.detected_ns == NOW - 2 * S // 10  # when 1 had been quiet 2 s
    assert hd.analyse(snap(a)) is not None  # nothing ever heard from 1: quiet


def test_a_missing_rank_waiting_in_a_younger_collective_is_followed() -> None:
    # The lab's shape (tp pairs {0,1} {2,3}, dp pairs {0,2} {1,3}) with rank 1 slow: 2 waits in
    # tp for 3 past the floor; 3 waits in dp for 1, not yet past the floor (dp's timeout is
    # longer). 3 is not the root: the chain leads to 1, whose fate decides.
    tp = blocked("tp1", (2, 3), {2: NOW - 5 * S // 2})
    dp = blocked("dp1", (1, 3), {3: NOW - 3 * S})
    dp = BlockedCollective(dp.comm, dp.seq, dp.members, dp.started, dp.ended, 0.2)  # 4 s timeout
    assert HangDetector().analyse(snap(tp, dp, last_end={1: NOW - S // 2})) is None
    f = HangDetector().analyse(snap(tp, dp, last_end={1: NOW - 10 * S}))
    assert f is not None and f.roots == (1,) and f.hosts == ("h0",)


def test_young_collectives_are_not_hangs() -> None:
    a = blocked("tp", (0, 1), {0: NOW - S})  # 1 s: under 3 step times (0.4 s each)
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


def gaps_snap(
    a: BlockedCollective, last_end: dict[int, int], gaps: dict[int, float]
) -> HangSnapshot:
    """1 s steps: the full timeout is 3 s, the suspect one 1 s."""
    hosts = {r: f"h{r // 4}" for r in range(16)}
    return HangSnapshot(
        NOW, (a,), hosts, {f"h{i}": NOW for i in range(4)}, NOW - 5 * S, 1.0, last_end, gaps
    )


def test_a_rank_quiet_for_far_longer_than_its_own_gaps_is_hung_within_two_steps() -> None:
    """Issue 32: 0 has waited 1.5 s (1.5 steps, under the 3-step timeout) in tp for 1, which
    completes a call every 20 ms at most and has completed nothing for 1.7 s."""
    a = blocked("tp", (0, 1), {0: NOW - 15 * S // 10})
    f = HangDetector().analyse(gaps_snap(a, {1: NOW - 17 * S // 10}, {1: 0.02}))
    assert f is not None and f.roots == (1,)
    # decided when tp had waited the suspect timeout (a step) and 1 been quiet the 1 s floor
    assert f.detected_ns == NOW - S // 2
    assert f.evidence["blocked"][0]["timeout_s"] == 1.0  # type: ignore[index]


def test_a_straggler_whose_gaps_stretch_less_than_the_factor_is_not_hung() -> None:
    """1 is 3x slow: its longest gap between calls was 0.5 s, now 1.5 s; 0 waits 2 s."""
    a = blocked("tp", (0, 1), {0: NOW - 2 * S})
    assert HangDetector().analyse(gaps_snap(a, {1: NOW - 15 * S // 10}, {1: 0.5})) is None
    # ... and a rank whose gaps are unknown is judged by the full timeout (3 steps) alone
    assert HangDetector().analyse(gaps_snap(a, {1: NOW - 5 * S}, {})) is None
    late = blocked("tp", (0, 1), {0: NOW - 31 * S // 10})
    f = HangDetector().analyse(gaps_snap(late, {1: NOW - 5 * S}, {}))
    assert f is not None and f.roots == (1,)


def test_the_quiet_limit_stays_within_the_floor_and_the_full_timeout() -> None:
    """1's gaps are long (2 s: a compute-bound rank): the full timeout (3 steps) decides; a
    rank with tiny gaps is still given the floor (an op it waits in may not be reported yet)."""
    a = blocked("dp", (0, 1), {0: NOW - 31 * S // 10})
    f = HangDetector().analyse(gaps_snap(a, {1: NOW - 31 * S // 10}, {1: 2.0}))
    assert f is not None and f.roots == (1,)
    b = blocked("dp", (0, 1), {0: NOW - 2 * S})  # past the suspect timeout only
    assert HangDetector().analyse(gaps_snap(b, {1: NOW - 2 * S}, {1: 2.0})) is None
    c = blocked("tp", (0, 1), {0: NOW - 15 * S // 10})
    assert HangDetector().analyse(gaps_snap(c, {1: NOW - 9 * S // 10}, {1: 0.001})) is None


def test_a_measured_in_flight_delay_raises_the_floor_never_lowers_it() -> None:
    """1 completes a call every 20 ms and has been quiet 1.7 s; tp has waited 1.5 s. Hung with
    the 1 s floor, and with a measured in-flight delay of 0.25 s (the floor stays 1 s: an
    envelope may lack its processes' newest completions); not yet where the job's agents
    report a call in flight only after 2 s: 1 may be inside a call not reported yet."""
    a = blocked("tp", (0, 1), {0: NOW - 15 * S // 10})
    base = gaps_snap(a, {1: NOW - 17 * S // 10}, {1: 0.02})
    for delay in (None, 0.25):
        f = HangDetector().analyse(replace(base, inflight_after_s=delay))
        assert f is not None and f.roots == (1,) and f.detected_ns == NOW - S // 2
    assert HangDetector().analyse(replace(base, inflight_after_s=2.0)) is None
    later = {h: NOW + S for h in base.host_last_ns}  # a second later, heard from every host
    f = HangDetector().analyse(replace(base, now_ns=NOW + S, host_last_ns=later,
                                       inflight_after_s=2.0))  # fmt: skip
    assert f is not None and f.roots == (1,)
    assert f.evidence["blocked"][0]["timeout_s"] == 2.0  # type: ignore[index]


def vouched(base: HangSnapshot, complete_ns: int, after_s: float) -> HangSnapshot:
    """Every host vouches (docs/ingest-v1.md, "Completeness") up to ``complete_ns``."""
    hosts = base.host_last_ns
    return replace(base, host_vouch=dict.fromkeys(hosts, (complete_ns, after_s)))


def test_hosts_that_vouch_for_what_they_sent_get_a_stopped_rank_named_sooner() -> None:
    """1 completes a call every 20 ms; 0 has waited 0.6 s in tp for it and it has been quiet
    0.8 s. Not hung by the 1 s floor; hung where every host vouches that what ended by now was
    sent and what was in flight for 0.25 s was reported: 1 is in no call and quiet past its gap
    and that delay. With its host vouching only up to 0.6 s ago, it is not yet."""
    a = blocked("tp", (0, 1), {0: NOW - 6 * S // 10})
    base = replace(gaps_snap(a, {1: NOW - 8 * S // 10}, {1: 0.02}), step_time_s=0.4)
    assert HangDetector().analyse(base) is None
    f = HangDetector().analyse(vouched(base, NOW, 0.25))
    assert f is not None and f.roots == (1,)
    assert f.evidence["blocked"][0]["timeout_s"] == 0.4  # type: ignore[index]  # (a step)
    assert HangDetector().analyse(vouched(base, NOW - 6 * S // 10, 0.25)) is None
    # where its instrumentation reports in flight only after 1 s, 1 may be inside a call
    assert HangDetector().analyse(vouched(base, NOW, 1.0)) is None


def test_a_late_pass_dates_a_vouched_hang_as_a_timely_one_would() -> None:
    """A pass that comes only once both judgements name 1 (1 quiet for 2 s, 0 blocked 1.8 s;
    a replay faster than the detection loop) dates it where the vouched one first could: a
    step after 0 began waiting (1 quiet for its gap and the announced 0.25 s by then), not
    when 1 had been quiet for its gap and the 1 s floor (the eval's stuck ranks read 1.4
    steps alone and 2.7 in a busy service before)."""
    a = blocked("tp", (0, 1), {0: NOW - 18 * S // 10})
    base = replace(gaps_snap(a, {1: NOW - 2 * S}, {1: 0.02}), step_time_s=0.4)
    late = HangDetector().analyse(vouched(base, NOW, 0.25))
    assert late is not None and late.roots == (1,)
    assert late.detected_ns == NOW - 14 * S // 10  # (was NOW - 0.98 s: gap + floor)
    alone = HangDetector().analyse(base)  # unvouched: the 1 s floor after 0 began waiting
    assert alone is not None and alone.detected_ns == NOW - 8 * S // 10


def test_a_host_that_stopped_vouching_is_judged_as_without() -> None:
    """1's process froze with its host's marks (SIGSTOP): its complete_ns stays 3 s old while
    the host's heartbeats go on. The vouched judgement cannot name it; the unvouched one does,
    as it did before anything was vouched for."""
    a = blocked("tp", (0, 1), {0: NOW - 15 * S // 10})
    base = gaps_snap(a, {1: NOW - 17 * S // 10}, {1: 0.02})
    stale = vouched(base, NOW - 3 * S, 0.25)
    f = HangDetector().analyse(stale)
    assert f is not None and f.roots == (1,)
    assert f.detected_ns == HangDetector().analyse(base).detected_ns  # type: ignore[union-attr]


def test_vouching_names_no_straggler() -> None:
    """1 is 3x slow: its longest gap was 0.1 s, it has been quiet 0.3 s between calls; 0 has
    waited 0.5 s. Vouched for up to now, it is still progressing."""
    a = blocked("tp", (0, 1), {0: NOW - S // 2})
    base = replace(gaps_snap(a, {1: NOW - 3 * S // 10}, {1: 0.1}), step_time_s=0.4)
    assert HangDetector().analyse(vouched(base, NOW, 0.25)) is None


def test_the_measured_floor_lowers_the_configured_one_to_the_delivery_lag_only() -> None:
    """The floor from the job's measured delays (``measured_floor_s``): the delivery lag with
    its margin may lower the configured floor, never raise it; the in-flight delay plus the
    envelopes' reordering is a lower bound whatever the lag says; unknown lags change nothing."""
    assert measured_floor_s(1.0, None, None) == 1.0
    assert measured_floor_s(1.0, 0.5, 0.25) == 0.5 * LAG_MARGIN
    assert measured_floor_s(1.0, 2.0, 0.25) == 1.0  # a longer lag: the configured floor
    assert measured_floor_s(1.0, 0.5, 0.7) == 0.7  # never below the in-flight delay ...
    assert measured_floor_s(1.0, 0.5, 0.7, 0.2) == 0.7 + 0.2  # ... plus the reordering
    assert measured_floor_s(1.0, 0.5, 3.0) == 3.0  # late in-flight reports raise it, as before
    assert measured_floor_s(1.0, 0.0, 0.0) == MIN_VOUCHED_FLOOR_S


def test_a_silent_host_is_dated_when_its_silence_sufficed_not_when_the_wait_began() -> None:
    """A host silent for 2x its own longest recent gap between envelopes (1.2 s: 2.4 s) has
    stopped with its ranks; where its cadence is unknown, only ``dead_after_s`` (5 s) says so.
    Either way the hang is dated when the silence sufficed: it was dated when the blocked
    collective crossed its timeout, seconds before the host could be called silent."""
    last_sent = NOW - 3 * S  # h3's last envelope; the others' are from NOW
    a = blocked("dp", (0, 4, 8, 12), {0: NOW - 4 * S, 4: NOW - 4 * S, 8: NOW - 4 * S})
    hosts = {r: f"h{r // 4}" for r in range(16)}
    last = {f"h{i}": (last_sent if i == 3 else NOW) for i in range(4)}
    base = HangSnapshot(NOW, (a,), hosts, last, NOW - 3 * S, 0.4, {12: last_sent - S // 10})
    assert HangDetector().analyse(base) is None  # silent 3 s: not the 5 s of dead_after_s
    known = replace(base, host_cadence_s={f"h{i}": (1.2, 0.0) for i in range(4)})
    f = HangDetector().analyse(known)
    assert f is not None and f.roots == (12,) and f.evidence["dead_hosts"] == ["h3"]
    assert f.detected_ns == last_sent + 2_400_000_000  # not NOW - 4 s + its timeout
    # a host whose envelopes arrive up to 1 s behind the others' (its clock, a relay): not yet
    behind = replace(base, host_cadence_s={**known.host_cadence_s, "h3": (1.2, 1.0)})
    assert HangDetector().analyse(behind) is None
    # with 5 s of silence and no cadence, dated at those 5 s
    late = replace(base, now_ns=last_sent + 6 * S)
    f = HangDetector().analyse(late)
    assert f is not None and f.roots == (12,) and f.detected_ns == last_sent + 5 * S
