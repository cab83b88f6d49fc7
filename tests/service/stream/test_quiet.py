"""Per-rank quiet gaps: the longest recent gap between two completed calls."""

from __future__ import annotations

import numpy as np

from failslow.service.stream.quiet import DeliveryLag, HostCadence, InflightDelay, QuietGaps
from failslow.wire.v2 import NO_END

MS = 1_000_000


def ends(*pairs: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    slot, end = zip(*pairs, strict=True)
    return np.array(slot, np.int64), np.array(end, np.int64)


def test_longest_gap_per_slot_across_batches_in_end_order() -> None:
    q = QuietGaps(min_gaps=2)
    # slot 0: ends at 10, 30, 35 (arriving out of order) -> gaps 20, 5; slot 1: 10, 12 -> 2
    q.note(*ends((0, 35 * MS), (1, 10 * MS), (0, 10 * MS), (0, 30 * MS), (1, 12 * MS)), 2)
    assert q.longest_s(0) == 0.020
    assert q.longest_s(1) != q.longest_s(1)  # one gap: too few to say
    q.note(*ends((1, 60 * MS), (1, NO_END)), 2)  # a gap of 48 ms across batches; NO_END ignored
    assert q.longest_s(1) == 0.048
    q.note(*ends((0, 20 * MS)), 2)  # older than the newest: no gap, nothing shortened
    assert q.longest_s(0) == 0.020 and q.last[0] == 35 * MS


def test_gaps_age_out_after_two_windows() -> None:
    q = QuietGaps(window_ns=1000 * MS, min_gaps=1)
    q.note(*ends((0, 100 * MS), (0, 600 * MS)), 1)  # 500 ms gap in the first window
    q.note(*ends((0, 1100 * MS), (0, 1110 * MS)), 1)  # next window: still counted
    assert q.longest_s(0) == 0.5
    q.note(*ends((0, 2100 * MS), (0, 2120 * MS)), 1)  # third window: the 500 ms gap is gone
    assert q.longest_s(0) == 0.99  # 1110 -> 2100 ms, seen in this window
    q.note(*ends((0, 5000 * MS), (0, 5010 * MS)), 1)  # windows passed with nothing
    assert q.longest_s(0) == 2.88


S = 1_000_000_000


def test_inflight_delay_is_the_youngest_report_of_any_host() -> None:
    d = InflightDelay(window_ns=600 * S)
    assert d.delay_s() is None  # nothing in flight seen yet: the configured floor holds
    t = 1_000 * S
    # one host's envelope: in flight for 0.75 and 1.25 s, and a completed call (not counted)
    d.note(t, t - np.array([3, 5, 0], np.int64) * (S // 4), np.array([NO_END, NO_END, t]))
    assert d.delay_s() == 0.75
    # another host's (records of two envelopes, each with its own sent_ns): 0.25 s the youngest
    sent = np.array([t, t, t + S], np.int64)
    d.note(sent, sent - np.array([1, 2, 9], np.int64) * (S // 4), np.full(3, NO_END))
    assert d.delay_s() == 0.25
    # a record that started after its own envelope was sealed says nothing
    d.note(t, np.array([t + S]), np.array([NO_END]))
    assert d.delay_s() == 0.25
    # two windows later what was seen then is forgotten: a longer delay now decides
    later = t + 1_300 * S
    d.note(later, np.array([later - 3 * S]), np.array([NO_END]))
    assert d.delay_s() == 3.0


def test_delivery_lag_is_the_longest_a_completion_stayed_out_of_what_its_host_sent() -> None:
    d = DeliveryLag(window_ns=600 * S, min_envelopes=3)
    t = 1_000 * S
    d.note("a", t, t - 200 * MS)
    d.note("a", t + 250 * MS, t + 100 * MS)  # 150 ms
    assert d.lag_s() is None  # two envelopes: too few to say
    d.note("b", t + 10 * MS, None)  # nothing completed: no lag (and not counted)
    assert d.lag_s() is None
    d.note("b", t + 20 * MS, t - 50 * MS)
    assert d.lag_s() == 0.2 and d.reorder_s() == 0.0
    # an envelope of "a" that arrives after a newer one of its host (sent 300 ms before it):
    # its completion was out of what "a" had been heard of until that newer one, 400 ms
    d.note("a", t - 50 * MS, t - 150 * MS)
    assert d.lag_s() == 0.4 and d.reorder_s() == 0.3
    d.note("a", t, t + 5 * S)  # an end after its own envelope was sent: a bad record
    assert d.lag_s() == 0.4
    # two windows later what was seen then is forgotten
    later = t + 1_300 * S
    for i in range(3):
        d.note("a", later + i * S, later + i * S - 100 * MS)
    assert d.lag_s() == 0.1 and d.reorder_s() == 0.0


def test_host_cadence_is_each_hosts_longest_recent_gap_and_how_far_behind_it_arrives() -> None:
    c = HostCadence(window_ns=60 * S, min_gaps=3)
    t = 1_000 * S
    for i in range(3):
        c.note("a", t + i * S, 0)  # two gaps of 1 s: too few to say
    assert c.longest_s() == {}
    c.note("a", t + 3500 * MS, t + 3 * S)  # a gap of 1.5 s
    c.note("a", t + 3 * S, t + 3500 * MS)  # older than its newest: no gap, but 0.5 s behind
    assert c.longest_s() == {"a": (1.5, 0.5)}
    for i in range(4):  # "b" every 0.25 s, its clock 2 s behind the job's now
        c.note("b", t + i * 250 * MS, t + i * 250 * MS + 2 * S)
    # ... which is its offset, not lateness: 2 s behind is how it always arrives
    assert c.longest_s() == {"a": (1.5, 0.5), "b": (0.25, 0.0)}
    assert c.offsets_ns() == {"b": 2 * S}  # "a" once arrived as the newest: no offset
    c.note("b", t + 1 * S, t + 3300 * MS)  # once 2.3 s behind: 0.3 s late past its offset
    assert c.longest_s()["b"] == (0.25, 0.3) and c.offsets_ns() == {"b": 2 * S}
    # two windows later the 1.5 s gap is forgotten; a host heard of in neither is left out
    for i in range(4, 134):
        c.note("a", t + i * S, t + i * S)
    assert c.longest_s() == {"a": (1.0, 0.0)}
    c.note("b", t + 200 * S, t + 133 * S)  # a silence is a gap too
    assert c.longest_s() == {"a": (1.0, 0.0), "b": (199, 0.0)}
    assert c.offsets_ns() == {}  # "b" arrived as the newest: its offset is forgotten
