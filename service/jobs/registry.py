"""All jobs held in memory, loaded from the database on first use, bounded in number."""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy.orm import Session, sessionmaker

from failslow.service.db import session_scope
from failslow.service.errors import Overloaded
from failslow.service.jobs.service import load_job
from failslow.service.jobs.state import JobState
from failslow.service.settings import StateSettings

log = logging.getLogger(__name__)


class JobRegistry:
    def __init__(self, *, settings: StateSettings, sessions: sessionmaker[Session]) -> None:
        self.settings = settings
        self.sessions = sessions
        self._jobs: dict[str, JobState] = {}
        self._lock = threading.Lock()

    def get(self, job: str) -> JobState | None:
        return self._jobs.get(job)

    def get_or_load(self, job: str) -> JobState:
        state = self._jobs.get(job)
        if state is not None:
            return state
        with self._lock:
            state = self._jobs.get(job)
            if state is not None:
                return state
            with session_scope(self.sessions) as session:
                state = load_job(session, job=job, settings=self.settings)
            if state is None:
                state = JobState(job, self.settings)
            else:
                log.info("job %s reloaded from the database", job)
            if len(self._jobs) >= self.settings.max_jobs:
                self._evict_one()
            self._jobs[job] = state
            return state

    def _evict_one(self) -> None:
        candidates = sorted(
            (s for s in self._jobs.values() if not s.deltas), key=lambda s: s.last_wall
        )
        if not candidates:
            raise Overloaded(
                f"holding {len(self._jobs)} jobs, none evictable",
                headers={"Retry-After": "5"},
            )
        victim = candidates[0]
        log.warning("evicting job %s from memory (max_jobs=%d)", victim.job, self.settings.max_jobs)
        del self._jobs[victim.job]

    def evict_idle(self, now_wall: float | None = None) -> list[str]:
        now = time.monotonic() if now_wall is None else now_wall
        gone: list[str] = []
        with self._lock:
            for job, state in list(self._jobs.items()):
                if not state.deltas and now - state.last_wall > self.settings.evict_after_s:
                    del self._jobs[job]
                    gone.append(job)
        return gone

    def all(self) -> list[JobState]:
        return list(self._jobs.values())
