"""All jobs held in memory, loaded on first use (through a loader the application gives), bounded
in number."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from failslow.service.stream.settings import StateSettings
from failslow.service.stream.state import JobState
from failslow.service.stream.topology import MemberBudget

log = logging.getLogger(__name__)


class RegistryFull(Exception):
    """Every job held in memory has uncommitted state: none can make room for another."""


class JobRegistry:
    def __init__(
        self,
        *,
        settings: StateSettings,
        load: Callable[[str], JobState | None],
        on_evict: Callable[[str], None] | None = None,
        holds: Callable[[str], bool] | None = None,
    ) -> None:
        """``load(job)``: the job as persisted (None for a new one). ``on_evict(job)``: called
        for every job that leaves memory, so that state kept elsewhere about it goes too.
        ``holds(job)``: whether this process keeps the job (with a bus, only the jobs it owns;
        another job read here is loaded for that read and not kept)."""
        self.settings = settings
        self.load = load
        self.on_evict = on_evict
        self.holds = holds
        self._jobs: dict[str, JobState] = {}
        self._lock = threading.Lock()
        self.members = MemberBudget(settings.max_total_comm_members)

    def _hold(self, job: str, state: JobState) -> None:
        """Keep ``state`` (under the lock): its members count against the service's budget."""
        self._jobs[job] = state
        state.topology.budget = self.members
        self.members.add(state.topology.comm_members)  # what it holds already, even past it

    def _let_go(self, state: JobState) -> None:
        self.members.release(state.topology.comm_members)
        state.topology.budget = None
        state.close()

    def adopt(self, job: str, state: JobState) -> None:
        """Hold ``state`` for ``job`` (a replica resuming a job from its snapshot)."""
        with self._lock:
            old = self._jobs.pop(job, None)
            if old is not None:
                self._let_go(old)
            elif len(self._jobs) >= self.settings.max_jobs:
                self._evict_one()
            self._hold(job, state)
        if old is not None:
            self._evicted(job)

    def drop(self, job: str) -> None:
        """Forget ``job`` now, committed or not (its replica no longer owns it)."""
        with self._lock:
            state = self._jobs.pop(job, None)
            if state is not None:
                self._let_go(state)
        if state is not None:
            self._evicted(job)

    def get(self, job: str) -> JobState | None:
        return self._jobs.get(job)

    def get_or_load(self, job: str) -> JobState:
        """The job's state (loaded, or new); raises :class:`RegistryFull`."""
        state = self._jobs.get(job)
        if state is not None:
            return state
        if self.holds is not None and not self.holds(job):
            return self.load(job) or JobState(job, self.settings)
        with self._lock:
            state = self._jobs.get(job)
            if state is not None:
                return state
            state = self.load(job)
            if state is None:
                state = JobState(job, self.settings)
            else:
                log.info("job %s reloaded from the database", job)
            if len(self._jobs) >= self.settings.max_jobs:
                self._evict_one()
            self._hold(job, state)
            return state

    def _evict_one(self) -> None:
        candidates = sorted(
            (s for s in self._jobs.values() if s.idle()), key=lambda s: s.last_wall
        )
        if not candidates:
            raise RegistryFull(f"holding {len(self._jobs)} jobs, none evictable")
        victim = candidates[0]
        log.warning("evicting job %s from memory (max_jobs=%d)", victim.job, self.settings.max_jobs)
        del self._jobs[victim.job]
        self._let_go(victim)
        self._evicted(victim.job)

    def evict_idle(self, now_wall: float | None = None) -> list[str]:
        now = time.monotonic() if now_wall is None else now_wall
        gone: list[str] = []
        with self._lock:
            for job, state in list(self._jobs.items()):
                if state.idle() and now - state.last_wall > self.settings.evict_after_s:
                    del self._jobs[job]
                    self._let_go(state)
                    gone.append(job)
        for job in gone:
            self._evicted(job)
        return gone

    def _evicted(self, job: str) -> None:
        if self.on_evict is not None:
            self.on_evict(job)

    def all(self) -> list[JobState]:
        return list(self._jobs.values())
