"""Incidents left open by a job that went away close as ``stale``.

A job that stops reporting (finished, killed, rescheduled elsewhere under another id) leaves
its open incidents with nobody to resolve them: the detectors resolve only on clean frames,
and none come. After ``detection.close_stale_after_s`` of wall time without an envelope, each
closes, saying when the job stopped reporting (its last event time). Silence is measured from
the job's last envelope when it is in memory, otherwise from this process's start (a job that
never came back after a restart). With replicas, each closes only the jobs it owns.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from failslow.service.db import session_scope
from failslow.service.detection.settings import DetectionSettings
from failslow.service.ids import rfc3339
from failslow.service.incidents import service as incidents
from failslow.service.incidents.models import Incident, IncidentResolution, IncidentState
from failslow.service.jobs import service as jobs_db
from failslow.service.metrics import Event, Metrics
from failslow.service.stream.registry import JobRegistry

log = logging.getLogger(__name__)


class StaleCloser:
    def __init__(
        self,
        *,
        settings: DetectionSettings,
        sessions: sessionmaker[Session],
        jobs: JobRegistry,
        metrics: Metrics,
        forget: Callable[[str], None],
        every_s: float = 5.0,
    ) -> None:
        self.settings, self.sessions, self.jobs, self.metrics = settings, sessions, jobs, metrics
        self.forget = forget
        self.every_s = min(every_s, max(0.2, settings.close_stale_after_s / 4))
        self.started = time.monotonic()
        self._last = -float("inf")

    def run_due(self) -> list[str]:
        """Close what is due (at most every ``every_s``); the ids closed."""
        after = self.settings.close_stale_after_s
        now = time.monotonic()
        if after <= 0 or now - self._last < self.every_s:
            return []
        self._last = now
        closed: list[str] = []
        gone: list[str] = []
        with session_scope(self.sessions) as s:
            rows = list(s.scalars(select(Incident).where(Incident.state == IncidentState.OPEN)))
            for job in sorted({r.job_id for r in rows}):
                if self.jobs.holds is not None and not self.jobs.holds(job):
                    continue
                state = self.jobs.get(job)
                silent_s = now - (state.last_wall if state is not None else self.started)
                if silent_s < after:
                    continue
                gone.append(job)
                job_row = jobs_db.get_job(s, job=job)
                last_ns = job_row.last_seen_ns if job_row is not None else None
                for row in (r for r in rows if r.job_id == job):
                    self._close(s, row, last_ns, silent_s)
                    closed.append(row.id)
        for job in gone:
            self.forget(job)  # if it comes back, detection starts afresh
        return closed

    def _close(self, s: Session, row: Incident, last_ns: int | None, silent_s: float) -> None:
        when = rfc3339(last_ns) if last_ns else "an unknown time"
        incidents.resolve_incident(
            s,
            incident=row,
            resolved_ns=time.time_ns(),
            resolved_step=None,
            evidence={
                "closed_as": IncidentResolution.STALE,
                "reason": f"the job stopped reporting at {when} (event time); nothing for "
                f"{silent_s:.0f} s",
                "last_seen_ns": last_ns,
            },
        )
        row.summary = (
            f"{row.summary.rstrip('.')}. Closed as stale: the job stopped reporting at {when}; "
            "whether the condition ended is unknown."
        )
        self.metrics.resolved.labels(row.kind).inc()
        self.metrics.incidents_closed_stale.labels(row.kind).inc()
        self.metrics.emit(Event.INCIDENT_RESOLVED, incidents.incident_attrs(row))
        log.info("incident %s closed as stale (job %s silent %.0f s)", row.id, row.job_id, silent_s)
