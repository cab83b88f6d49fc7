"""Row helpers of the fleet ledger's tables: a part found or created, rows read by key in
chunks, a part's readings kept to a bound (the oldest pooled into its archive row)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from failslow.detectors.fleet import JobReading, merge
from failslow.service.fleet import standing
from failslow.service.fleet.identity import Part
from failslow.service.fleet.models import ARCHIVE, FleetPart, FleetReading, in_chunks


def new_part(part: Part, now_ns: int) -> FleetPart:
    return FleetPart(part_id=part.part_id, kind=part.kind, host=part.host, label=part.label,
                     id_source=part.id_source, first_seen_ns=now_ns, last_seen_ns=now_ns,
                     state=standing.HEALTHY, state_since_ns=now_ns, state_reason="",
                     clean_s=0.0, clean_jobs=[], jobs_total=0, incidents_total=0,
                     lost_s_total=0.0, health={}, flagged=False, cost_s=0.0)  # fmt: skip


def rows(s: Session, model: Any, key: Any, values: list[str]) -> list[Any]:
    """``model`` rows whose ``key`` is in ``values``."""
    out: list[Any] = []
    for chunk in in_chunks(values):
        out += s.scalars(select(model).where(key.in_(chunk)))
    return out


def ensure_part(s: Session, part: Part, now_ns: int) -> FleetPart:
    row = s.get(FleetPart, part.part_id)
    if row is None:
        row = new_part(part, now_ns)
        s.add(row)
        s.flush()
    else:
        row.host, row.last_seen_ns = part.host, max(row.last_seen_ns, now_ns)
    return row


def reading_of(r: FleetReading) -> JobReading:
    """A stored reading as the fleet model takes it."""
    return JobReading(r.n, r.mean, r.var, r.observed_s, r.lost_s)


def store_reading(r: FleetReading, m: JobReading) -> None:
    """Write ``m``'s numbers into the stored reading ``r``."""
    r.n, r.mean, r.var, r.observed_s, r.lost_s = m.n, m.mean, m.var, m.observed_s, m.lost_s


def prune_readings(s: Session, part_id: str, keep: int) -> None:
    """At most ``keep`` readings per part: the oldest pooled into its archive row."""
    rows = list(s.scalars(select(FleetReading).where(FleetReading.part_id == part_id)
                          .order_by(FleetReading.last_ns)))  # fmt: skip
    if len(rows) <= keep:
        return
    archive = next((r for r in rows if r.job_id == ARCHIVE), None)
    old = [r for r in rows if r.job_id != ARCHIVE][: len(rows) - keep + (archive is None)]
    acc = reading_of(archive) if archive else JobReading(0, 0.0, 0.0, 0.0)
    for r in old:
        acc = merge(acc, reading_of(r))
        s.delete(r)
    if archive is None:
        archive = FleetReading(
            part_id=part_id,
            job_id=ARCHIVE,
            first_ns=old[0].first_ns,
            last_ns=old[-1].last_ns,
            n=0,
            mean=0.0,
            var=0.0,
            observed_s=0.0,
            lost_s=0.0,
        )
        s.add(archive)
    store_reading(archive, acc)
    archive.last_ns = max(archive.last_ns, old[-1].last_ns)


__all__ = ["ensure_part", "new_part", "prune_readings", "reading_of", "rows", "store_reading"]
