"""What the detection loop and the mitigation policy read of runtime control, from the database
at most once a second per job (so that a change made through another replica holds within a
second, and a pass over many jobs does not query each of them every 0.25 s)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from failslow.service.control import service as control
from failslow.service.control.service import ControlState
from failslow.service.db import session_scope
from failslow.service.detection.settings import DetectionSettings, JobTuning

log = logging.getLogger(__name__)


class Controls:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        detection: DetectionSettings,
        *,
        ttl_s: float = 1.0,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.sessions, self.detection, self.ttl_s, self.clock = sessions, detection, ttl_s, clock
        self._cache: dict[str, tuple[float, ControlState, JobTuning]] = {}
        self._lock = threading.Lock()
        self._bad: set[tuple[str, str]] = set()  # (job, overrides) already logged as invalid

    def _read(self, job: str) -> tuple[ControlState, JobTuning]:
        now = time.monotonic()
        hit = self._cache.get(job)
        if hit is not None and now - hit[0] < self.ttl_s:
            return hit[1], hit[2]
        with session_scope(self.sessions) as s:
            row = control.get(s, job=job)
            fleet, own = control.overrides(s, job=job)
            state = control.state_of(row, self.clock())
        merged = {**fleet, **own}
        try:
            self.detection.tuned(merged)
        except ValueError as exc:  # e.g. an override no longer valid with new defaults
            if (job, repr(merged)) not in self._bad:
                self._bad.add((job, repr(merged)))
                log.error("job %s: overrides %s ignored: %s", job, merged, exc)
            merged = {}
        tuning = JobTuning(paused=state.paused, overrides=merged)
        with self._lock:
            self._cache[job] = (now, state, tuning)
        return state, tuning

    def state(self, job: str) -> ControlState:
        return self._read(job)[0]

    def tuning(self, job: str) -> JobTuning:
        return self._read(job)[1]

    def changed(self, job: str | None = None) -> None:
        """Forget what was read (after a change made here): all jobs for a fleet change."""
        with self._lock:
            if job is None or job == control.FLEET:
                self._cache.clear()
            else:
                self._cache.pop(job, None)
