"""Prometheus gauges of the fleet's health, with bounded cardinality.

Per part, only the ``gauges_top`` least healthy of each kind (flagged ones first, then by job
time lost, then by score) get series, so that a fleet of 10,000 GPUs exports at most
3 x ``gauges_top`` of each per-part gauge; the counts per kind and state cover every part. The
ledger's tables are read at most once per ``ttl_s`` (scrapes in between get the last read).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from failslow.detectors.fleet import PartKind, PartState
from failslow.service.fleet.models import FleetPart

LABELS = ["kind", "part", "host"]


@dataclass(frozen=True, slots=True)
class PartSample:
    kind: str
    part: str
    host: str
    score: float
    slowness: float
    cost_s: float
    flagged: bool
    state: str


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    parts: list[PartSample]
    counts: dict[tuple[str, str], int]  # (kind, state) -> parts


def read_snapshot(s: Session, top: int) -> FleetSnapshot:
    counts = {(k.value, st.value): 0 for k in PartKind for st in PartState}
    for kind, state, n in s.execute(
        select(FleetPart.kind, FleetPart.state, func.count()).group_by(FleetPart.kind,
                                                                       FleetPart.state)
    ):  # fmt: skip
        counts[(kind, state)] = int(n)
    parts: list[PartSample] = []
    if top > 0:
        for kind in PartKind:
            rows = s.scalars(
                select(FleetPart).where(FleetPart.kind == kind.value)
                .order_by(FleetPart.flagged.desc(), FleetPart.cost_s.desc(), FleetPart.part_id)
                .limit(top)
            )  # fmt: skip
            for r in rows:
                h = r.health or {}
                parts.append(PartSample(
                    kind=r.kind, part=r.part_id, host=r.host,
                    score=float(h.get("score", 1.0)),  # type: ignore[arg-type]
                    slowness=float(h.get("slowness", 1.0)),  # type: ignore[arg-type]
                    cost_s=r.cost_s, flagged=r.flagged, state=r.state,
                ))  # fmt: skip
    return FleetSnapshot(parts, counts)


class FleetCollector(Collector):
    """Reads the ledger's standing at scrape time (cached for ``ttl_s``)."""

    def __init__(self, sessions: sessionmaker[Session], *, top: int, ttl_s: float) -> None:
        self.sessions, self.top, self.ttl_s = sessions, top, ttl_s
        self._lock = threading.Lock()
        self._cached: tuple[float, FleetSnapshot] | None = None

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # dynamic: nothing to pre-register

    def snapshot(self) -> FleetSnapshot:
        with self._lock:
            now = time.monotonic()
            if self._cached is None or now - self._cached[0] >= self.ttl_s:
                with self.sessions() as s:
                    self._cached = (now, read_snapshot(s, self.top))
            return self._cached[1]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snap = self.snapshot()
        health = GaugeMetricFamily(
            "failslow_fleet_part_health",
            "A part's health score across jobs (1 = keeps its peers' speed, no incidents); "
            "only the least healthy parts of each kind (FAILSLOW_FLEET__GAUGES_TOP).",
            labels=LABELS,
        )
        slowness = GaugeMetricFamily(
            "failslow_fleet_part_slowness_ratio",
            "A part's pooled speed against its peers across jobs (1.06 = 6% slower).",
            labels=LABELS,
        )
        cost = GaugeMetricFamily(
            "failslow_fleet_part_cost_seconds",
            "Job time lost to incidents that named the part (decayed).",
            labels=LABELS,
        )
        flagged = GaugeMetricFamily(
            "failslow_fleet_part_flagged",
            "1 while the part is flagged (confidently slow or a repeat offender).",
            labels=LABELS,
        )
        state = GaugeMetricFamily(
            "failslow_fleet_parts", "Parts the fleet ledger knows, per kind and standing.",
            labels=["kind", "state"],
        )  # fmt: skip
        for p in snap.parts:
            labels = [p.kind, p.part, p.host]
            health.add_metric(labels, p.score)
            slowness.add_metric(labels, p.slowness)
            cost.add_metric(labels, p.cost_s)
            flagged.add_metric(labels, 1.0 if p.flagged else 0.0)
        for (kind, st), n in sorted(snap.counts.items()):
            state.add_metric([kind, st], float(n))
        yield from (health, slowness, cost, flagged, state)


__all__ = ["FleetCollector", "FleetSnapshot", "read_snapshot"]
