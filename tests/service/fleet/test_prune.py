"""A part's readings beyond the bound are pooled into its archive row, nothing lost."""

from __future__ import annotations

import math

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from failslow.detectors.fleet import JobReading, merge
from failslow.service.fleet.identity import host_part
from failslow.service.fleet.models import ARCHIVE, FleetReading
from failslow.service.fleet.rows import ensure_part, prune_readings, reading_of


def test_the_oldest_readings_pool_into_the_archive(sessions: sessionmaker[Session]) -> None:
    given = [JobReading(10 + i, 0.01 * i, 0.001, 60.0 + i, 0.5 * i) for i in range(5)]
    with sessions() as s:
        part = ensure_part(s, host_part("n0"), 1)
        for i, r in enumerate(given):
            s.add(FleetReading(part_id=part.part_id, job_id=f"j{i}", n=r.n, mean=r.mean,
                               var=r.var, observed_s=r.observed_s, lost_s=r.lost_s,
                               first_ns=i, last_ns=i))  # fmt: skip
        s.flush()
        prune_readings(s, part.part_id, keep=3)  # j0..j2 into the archive, j3 and j4 kept
        prune_readings(s, part.part_id, keep=3)  # within the bound: nothing moves
        s.commit()
        rows = {r.job_id: r for r in s.scalars(select(FleetReading))}
    assert sorted(rows) == sorted([ARCHIVE, "j3", "j4"])
    want = merge(merge(given[0], given[1]), given[2])
    got = reading_of(rows[ARCHIVE])
    assert (got.n, got.observed_s, got.lost_s) == (want.n, want.observed_s, want.lost_s)
    assert math.isclose(got.mean, want.mean) and math.isclose(got.var, want.var)
    assert rows[ARCHIVE].last_ns == 2 and reading_of(rows["j4"]) == given[4]
