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
