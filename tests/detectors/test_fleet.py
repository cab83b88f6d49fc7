"""The fleet model: pooled speed with shrinkage, incident rates with decay."""

from __future__ import annotations

import math

import numpy as np

from failslow.detectors.fleet import (
    FleetModel,
    IncidentMark,
    JobReading,
    SpeedTally,
    fleet_rate,
    health,
    link_readings,
    merge,
    pooled,
    tau_of,
)

M = FleetModel()


def reading(ratio: float, n: int = 200, sd: float = 0.03) -> JobReading:
    return JobReading(n=n, mean=math.log(ratio), var=sd * sd, observed_s=n * 1.0)


def judge(readings: list[JobReading], marks: list[IncidentMark] = (), now: float = 0.0):  # type: ignore[assignment]
    return health(readings, list(marks), now_s=now, tau=0.01, fleet_rate_per_h=0.001, model=M)


def test_a_chronically_slow_part_is_flagged_after_a_few_jobs_not_after_one() -> None:
    one = judge([reading(1.06)])
    assert not one.slow and one.slowness < 1.06  # shrunk towards the fleet
    flagged_at = next(k for k in range(1, 20) if judge([reading(1.06)] * k).slow)
    assert 2 <= flagged_at <= 4
    three = judge([reading(1.06)] * 6)
    assert three.slow and three.low > M.flag_ratio and "slower than its peers" in three.reasons[0]


def test_healthy_parts_are_never_flagged_however_many_jobs() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        ratios = np.exp(rng.normal(0, 0.01, size=int(rng.integers(1, 60))))
        assert not judge([reading(float(r)) for r in ratios]).flagged


def test_a_short_job_says_little() -> None:
    short = judge([reading(1.2, n=25, sd=0.2)])
    long = judge([reading(1.2, n=500, sd=0.02)])
    assert short.sd > long.sd and short.slowness < long.slowness
    assert judge([reading(1.2, n=5)]).jobs == 0  # under min_frames: no reading at all


def test_tau_is_robust_to_the_few_faulty_parts() -> None:
    rng = np.random.default_rng(1)
    healthy = [reading(float(math.exp(rng.normal(0, 0.02)))) for _ in range(500)]
    faulty = [reading(1.5)] * 20
    tau = tau_of(healthy + faulty, M)
    assert 0.015 < tau < 0.03
    assert tau_of(healthy[:5], M) == M.tau_floor  # too few readings: the floor


def test_repeat_offender_needs_several_jobs_and_recovers_with_time() -> None:
    day = 86400.0
    once = [IncidentMark("a", 0.0, 30.0, False)]
    assert not judge([reading(1.0)], once, now=day).offender
    twice = once + [IncidentMark("b", day, 30.0, False), IncidentMark("c", 2 * day, 30.0, False)]
    h = judge([reading(1.0)] * 3, twice, now=2 * day)
    assert h.offender and h.cost_s >= 90.0 and "incidents in 3 jobs" in h.reasons[0]
    later = judge([reading(1.0)] * 3, twice, now=2 * day + 60 * day)  # weeks clean
    assert not later.offender


def test_tally_readings_and_pooling() -> None:
    t = SpeedTally()
    t.add(np.array([1.0, 1.1, np.nan]), 0.5)
    t.add(np.array([1.0, 1.1, 1.2, 1.3]), 0.5)  # the job grew
    r1 = t.reading(1)
    assert r1 is not None and r1.n == 2 and abs(r1.mean - math.log(1.1)) < 1e-12
    assert r1.observed_s == 1.0 and r1.var < 1e-12
    assert t.reading(2).n == 1 and t.reading(9) is None  # type: ignore[union-attr]
    m = merge(reading(1.0, n=100), reading(1.1, n=100))
    assert abs(m.mean - math.log(1.1) / 2) < 1e-12 and m.var > 0.03**2
    p = pooled([reading(1.0), reading(1.08)])
    assert abs(p.mean - math.log(1.08) / 2) < 1e-12 and p.var < 0.03**2


def test_fleet_rate_has_a_floor() -> None:
    assert fleet_rate(0, 0.0) > 0
    assert fleet_rate(100, 3600.0 * 1e6) < fleet_rate(100, 3600.0 * 10)


L = FleetModel().links()


def checks(speed: float, k: int, noise: float, rng: np.random.Generator) -> list[JobReading]:
    """``k`` link checks of a NIC at ``speed`` x the reference (one reading each)."""
    return [JobReading(1, math.log(1 / speed) + float(rng.normal(0, noise)), 0.0, 0.0)
            for _ in range(k)]  # fmt: skip


def test_link_readings_are_each_hosts_best_pair_and_need_two_pairs() -> None:
    ring = [("a", "b", 900.0), ("b", "c", 500.0), ("c", "d", 500.0), ("d", "a", 950.0),
            ("e", "a", 0.0)]  # fmt: skip  (a failed test says nothing)
    got = link_readings(ring, 900.0)
    assert set(got) == {"a", "b", "c", "d"}  # e: one pair, and it failed
    assert got["c"] == math.log(900 / 500) and got["b"] == 0.0
    assert got["a"] == math.log(900 / 950) < 0  # faster than the reference
    assert link_readings([("x", "y", 3.0)], 900.0) == {}  # one pair cannot say which end
    assert link_readings(ring, 0.0) == {}


def test_a_nic_slower_in_every_link_check_is_flagged_after_a_few_checks_not_one() -> None:
    rng = np.random.default_rng(1)
    tau = 0.15
    for speed, by in ((0.5, 3), (0.62, 6)):  # its pairs at half, or 62%, of the fast ones
        seen = checks(speed, 12, 0.05, rng)
        flagged_at = next(k for k in range(1, 13)
                          if health(seen[:k], [], now_s=0, tau=tau, fleet_rate_per_h=0.001,
                                    model=L).slow)  # fmt: skip
        assert L.min_jobs <= flagged_at <= by, (speed, flagged_at)
    h = health(checks(0.5, 5, 0.05, rng), [], now_s=0, tau=tau, fleet_rate_per_h=0.001, model=L)
    assert h.reasons[0].startswith("links ") and "over 5 link checks" in h.reasons[0]
    assert h.cost_s == 0.0  # what a slow link cost is its incidents' lost time, not a ratio
    # a single very slow check (a busy path) is not enough, however slow
    assert not health(checks(0.1, 1, 0.0, rng), [], now_s=0, tau=tau, fleet_rate_per_h=0.001,
                      model=L).slow  # fmt: skip


def test_healthy_nics_with_noisy_link_checks_are_never_flagged() -> None:
    """Link checks on busy hosts spread far more than compute ratios (a lab's healthy pairs:
    386 and 786 MB/s side by side): 25% noise, and the fleet's spread estimated from it."""
    rng = np.random.default_rng(2)
    fleet = [checks(1.0, int(rng.integers(1, 40)), 0.25, rng) for _ in range(200)]
    tau = tau_of((r for part in fleet for r in part), L)
    assert tau >= L.tau_floor
    assert not any(health(part, [], now_s=0, tau=tau, fleet_rate_per_h=0.001, model=L).flagged
                   for part in fleet)  # fmt: skip
