"""All jobs held in memory, loaded on first use (through a loader the application gives), bounded
in number, in total and per tenant.

A tenant is the set of jobs one scoped ingest token may send for (``tenant_of``, from the
application's auth settings): its jobs together may hold at most ``tenant_share`` of
``max_jobs`` and of ``max_total_comm_members``, so one tenant cannot evict the others' jobs or
take every communicator member (issue 31). With ``keep_unsaved`` (snapshots on), a job leaves
memory only once what it was sent is in its snapshot: the job is reloaded with it, so nothing
acknowledged is lost unanalysed; a job that has more is handed to ``save`` first, and meanwhile
another job leaves or the new one waits (429).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

from failslow.service.stream.settings import StateSettings
from failslow.service.stream.state import JobState
from failslow.service.stream.topology import MemberBudget

log = logging.getLogger(__name__)


class RegistryFull(Exception):
    """No job held in memory can make room for another now (or its tenant's share is full)."""


class JobRegistry:
    def __init__(
        self,
        *,
        settings: StateSettings,
        load: Callable[[str], JobState | None],
        on_evict: Callable[[str], None] | None = None,
        holds: Callable[[str], bool] | None = None,
        tenant_of: Callable[[str], str | None] | None = None,
        save: Callable[[list[JobState]], None] | None = None,
    ) -> None:
        """``load(job)``: the job as persisted (None for a new one). ``on_evict(job)``: called
        for every job that leaves memory, so that state kept elsewhere about it goes too.
        ``holds(job)``: whether this process keeps the job (with a bus, only the jobs it owns;
        another job read here is loaded for that read and not kept). ``tenant_of(job)``: the
        tenant a job belongs to (None: no tenant). ``save(states)``: have these jobs' snapshots
        written soon (without it, a job leaves memory with whatever it holds)."""
        self.settings = settings
        self.load = load
        self.on_evict = on_evict
        self.holds = holds
        self.tenant_of = tenant_of or (lambda job: None)
        self.save = save
        self._jobs: dict[str, JobState] = {}
        self._tenant: dict[str, str] = {}  # job -> its tenant, for the jobs held that have one
        self._per_tenant: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.members = MemberBudget(settings.max_total_comm_members)
        self._budgets: dict[str, MemberBudget] = {}

    def _budget(self, tenant: str | None) -> MemberBudget:
        if tenant is None:
            return self.members
        b = self._budgets.get(tenant)
        if b is None:
            share = int(self.settings.tenant_share * self.settings.max_total_comm_members)
            b = self._budgets[tenant] = MemberBudget(share, parent=self.members,
                                                     label=f"tenant {tenant!r}")  # fmt: skip
        return b

    def _hold(self, job: str, state: JobState) -> None:
        """Keep ``state`` (under the lock): its members count against the budgets."""
        tenant = self.tenant_of(job)
        self._jobs[job] = state
        if tenant is not None:
            self._tenant[job] = tenant
            self._per_tenant[tenant] += 1
        state.topology.budget = budget = self._budget(tenant)
        budget.add(state.topology.comm_members)  # what it holds already, even past it

    def _let_go(self, job: str, state: JobState) -> None:
        tenant = self._tenant.pop(job, None)
        if tenant is not None:
            self._per_tenant[tenant] -= 1
            if not self._per_tenant[tenant]:
                del self._per_tenant[tenant]
        if state.topology.budget is not None:
            state.topology.budget.release(state.topology.comm_members)
        state.topology.budget = None
        state.close()

    def adopt(self, job: str, state: JobState) -> None:
        """Hold ``state`` for ``job`` (a replica resuming a job from its snapshot)."""
        with self._lock:
            old = self._jobs.pop(job, None)
            if old is not None:
                self._let_go(job, old)
            else:
                self._make_room(job)
            self._hold(job, state)
        if old is not None:
            self._evicted(job)

    def drop(self, job: str) -> None:
        """Forget ``job`` now, committed or not (its replica no longer owns it)."""
        with self._lock:
            state = self._jobs.pop(job, None)
            if state is not None:
                self._let_go(job, state)
        if state is not None:
            self._evicted(job)

    def get(self, job: str) -> JobState | None:
        return self._jobs.get(job)

    def watermark_of(self, job: str) -> int | None:
        """The job's event-time now, if it is in memory."""
        state = self._jobs.get(job)
        return state.watermark_ns if state is not None else None

    def get_or_load(self, job: str) -> JobState:
        """The job's state (loaded, or new); raises :class:`RegistryFull`."""
        state = self._get(job, create=True)
        assert state is not None
        return state

    def existing(self, job: str) -> JobState | None:
        """The job's state if it is held or stored (loaded then), else None: nothing is
        created (a request that names a job nobody registered must not make one; issue 31);
        raises :class:`RegistryFull`."""
        return self._get(job, create=False)

    def _get(self, job: str, *, create: bool) -> JobState | None:
        state = self._jobs.get(job)
        if state is not None:
            return state
        if self.holds is not None and not self.holds(job):
            state = self.load(job)
            return state if state is not None or not create else JobState(job, self.settings)
        with self._lock:
            state = self._jobs.get(job)
            if state is not None:
                return state
            state = self.load(job)
            if state is None:
                if not create:
                    return None
                state = JobState(job, self.settings)
            else:
                log.info("job %s reloaded from the database", job)
            self._make_room(job)
            self._hold(job, state)
            return state

    def _make_room(self, job: str) -> None:
        """Before holding ``job`` (under the lock): within its tenant's share and ``max_jobs``,
        letting the least recently active jobs go (of its own tenant when its share is full)."""
        s = self.settings
        tenant = self.tenant_of(job)
        if tenant is not None and self._per_tenant[tenant] >= int(s.tenant_share * s.max_jobs):
            self._evict_one(tenant, f"tenant {tenant!r} holds its share of max_jobs "
                                    f"({s.tenant_share:g} of {s.max_jobs})")  # fmt: skip
        elif len(self._jobs) >= s.max_jobs:
            self._evict_one(None, f"holding {len(self._jobs)} jobs (max_jobs)")

    def _leaves(self, state: JobState) -> bool:
        """Whether ``state`` may leave memory now: nothing of it waits to be written, and
        (with snapshots) nothing it was sent is missing from its snapshot."""
        return state.idle() and (self.save is None or not state.unsaved)

    def _evict_one(self, tenant: str | None, why: str) -> None:
        held = [s for s in self._jobs.values()
                if tenant is None or self._tenant.get(s.job) == tenant]  # fmt: skip
        held.sort(key=lambda s: s.last_wall)
        victim = next((s for s in held if self._leaves(s)), None)
        if victim is None:
            waiting = [s for s in held if s.idle()][:8]
            if waiting and self.save is not None:
                self.save(waiting)  # their snapshots first: then they may leave
            raise RegistryFull(f"{why}; none can leave memory now")
        log.warning("evicting job %s from memory: %s", victim.job, why)
        del self._jobs[victim.job]
        self._let_go(victim.job, victim)
        self._evicted(victim.job)

    def evict_idle(self, now_wall: float | None = None) -> list[str]:
        now = time.monotonic() if now_wall is None else now_wall
        gone: list[str] = []
        unsaved: list[JobState] = []
        with self._lock:
            for job, state in list(self._jobs.items()):
                if state.idle() and now - state.last_wall > self.settings.evict_after_s:
                    if not self._leaves(state):
                        unsaved.append(state)
                        continue
                    del self._jobs[job]
                    self._let_go(job, state)
                    gone.append(job)
        if unsaved and self.save is not None:
            self.save(unsaved)
        for job in gone:
            self._evicted(job)
        return gone

    def _evicted(self, job: str) -> None:
        if self.on_evict is not None:
            self.on_evict(job)

    def all(self) -> list[JobState]:
        return list(self._jobs.values())
