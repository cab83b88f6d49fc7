"""The job's event-time "now": one host's clock cannot move it; the job as a whole can."""

from __future__ import annotations

from failslow.service.stream.clock import EventClock
from failslow.service.stream.settings import StateSettings
from failslow.service.stream.state import JobState

S = 1_000_000_000
T0 = 1_700_000_000 * S
HOUR = 3600 * S
INT64_MAX = 2**63 - 1


def clock() -> EventClock:
    return EventClock(tolerance_ns=2 * S, live_s=10.0)


def round_of(c: EventClock, hosts: int, t_ns: int, wall: float) -> None:
    for h in range(hosts):
        c.observe(h, t_ns + h * 10_000_000, wall)


def test_one_host_an_hour_ahead_does_not_move_the_job() -> None:
    c = clock()
    for k in range(5):
        round_of(c, 8, T0 + k * S, wall=float(k))
    before = c.watermark_ns
    c.observe(3, T0 + HOUR, wall=5.0)  # one heartbeat from a host whose clock stepped
    assert c.watermark_ns <= before + 2 * S
    assert c.ahead_ns[3] > HOUR - 10 * S and c.held_back == 1
    c.observe(5, INT64_MAX, wall=5.1)  # a forged envelope
    assert c.watermark_ns <= before + 2 * S
    # the damage is bounded by the tolerance: now moved at most 2 s past the honest median
    assert c.watermark_ns <= T0 + 4 * S + 70_000_000 + 2 * S  # the newest honest + 2 s
    round_of(c, 8, T0 + 5 * S, wall=6.0)  # the job goes on; hosts 3 and 5 are back on time
    assert T0 + 5 * S <= c.watermark_ns <= T0 + 6 * S + 0.1 * S
    assert c.ahead_ns == {}


def test_the_job_moving_on_together_moves_now() -> None:
    """After a pause (or in a replay, where event time runs faster than the wall clock) every
    host jumps ahead: once most of them did, the watermark follows."""
    c = clock()
    round_of(c, 8, T0, wall=0.0)
    for h in range(8):
        c.observe(h, T0 + 600 * S, wall=0.01)  # ten minutes of event time in 10 ms of wall
    assert c.watermark_ns >= T0 + 600 * S


def test_two_hosts_cannot_outvote_each_other() -> None:
    # no majority with two: the newest counts, as it always did (a halted host must not freeze
    # the job's time: that is how a dead host is noticed)
    c = clock()
    c.observe(0, T0, wall=0.0)
    c.observe(1, T0, wall=0.0)
    c.observe(1, T0 + 60 * S, wall=0.5)
    assert c.watermark_ns == T0 + 60 * S


def test_a_host_that_stopped_sending_stops_voting() -> None:
    c = clock()
    round_of(c, 3, T0, wall=0.0)
    # hosts 0 and 1 die; host 2 goes on: after live_s of wall time only host 2 votes
    c.observe(2, T0 + 30 * S, wall=5.0)
    assert c.watermark_ns <= T0 + 3 * S  # 0 and 1 were live a moment ago: held back
    c.observe(2, T0 + 40 * S, wall=20.0)
    assert c.watermark_ns == T0 + 40 * S  # they stopped voting: the dead are noticed


def test_replayed_history_in_the_past_works() -> None:
    c = clock()
    past = 1_500_000_000 * S  # years before the service's clock
    for k in range(20):
        round_of(c, 6, past + k * S, wall=k * 0.001)
    assert c.watermark_ns == past + 19 * S + 5 * 10_000_000


def test_job_state_holds_a_jumping_host_back_and_restores_the_watermark() -> None:
    state = JobState("j", StateSettings())
    for k in range(3):
        for h in range(4):
            state.begin(f"h{h}", T0 + k * S, "a", None, 0)
    state.begin("h2", T0 + HOUR, "a", None, 0)
    assert state.watermark_ns < T0 + 5 * S
    assert state.clock.ahead_ns == {state.topology.host_ids["h2"]: HOUR - 2 * S}
    again = JobState("j", StateSettings())
    again.watermark_ns = state.watermark_ns  # what a restart reads from the database
    assert again.watermark_ns == state.watermark_ns


def test_a_restored_clock_lets_silent_hosts_stop_voting() -> None:
    c = clock()
    round_of(c, 3, T0, wall=1e9)  # another process's monotonic clock, far ahead of ours
    c.rebase(0.0)
    c.observe(2, T0 + 30 * S, wall=20.0)  # hosts 0 and 1 never send again
    assert c.watermark_ns == T0 + 30 * S
