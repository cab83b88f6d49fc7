"""Accepting an envelope: apply it to the job's memory, then answer once its accounting is durable.

The accounting (per-host counters, agent stream positions, new topology) of every envelope applied
meanwhile is written in one transaction by the :class:`Committer`: while one commit runs, and
for at least ``ingest.commit_interval_s`` after the last, the envelopes that arrive wait for the
next, so the database sees a few commits a second however many envelopes come. If a commit
fails, what it carried goes back into the jobs (it is additive) and leaves with their next
commit; the clients get 503 and re-send, which the stream positions recognise as duplicates.
Either way every record is counted exactly once.

A commit the database refuses for good (a constraint, a value a column cannot hold) is written
again row by row, dropping (logged, counted) only the rows refused: it never blocks the job
(:mod:`.salvage`).

Given :class:`Snapshots` (without a bus: ``replica.local.LocalSnapshots``), a commit also writes
the snapshot of each job that is due, taken with its counters, in the same transaction.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from failslow.service.db import session_scope
from failslow.service.errors import Overloaded, Unavailable
from failslow.service.ingest.salvage import Row, store
from failslow.service.jobs.service import Uncommitted, restore, take_uncommitted
from failslow.service.lease import Lease, LeaseLost
from failslow.service.stream.columnar import UnknownTopology
from failslow.service.stream.registry import JobRegistry, RegistryFull
from failslow.service.stream.state import ApplyResult, JobState
from failslow.service.stream.v2apply import apply_v2_many
from failslow.wire.v2 import Layout

log = logging.getLogger(__name__)
T = TypeVar("T")


def job_state(jobs: JobRegistry, job: str) -> JobState:
    try:
        return jobs.get_or_load(job)
    except RegistryFull as exc:
        raise Overloaded(str(exc), headers={"Retry-After": "5"}) from None


def existing_job(jobs: JobRegistry, job: str) -> JobState | None:
    """The job if it is held or stored (None: nothing is created for it)."""
    try:
        return jobs.existing(job)
    except RegistryFull as exc:
        raise Overloaded(str(exc), headers={"Retry-After": "5"}) from None


def apply(state: JobState, fn: Callable[[JobState], T]) -> T:
    """Run ``fn`` on the job under its lock."""
    with state.lock:
        return fn(state)


@dataclass(slots=True)
class Queued:
    """A v2 envelope waiting to be applied with the next commit."""

    header: dict[str, Any]
    body: bytes
    layout: Layout
    future: asyncio.Future[ApplyResult]


def _retrieved(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.warning("a snapshot written to let a job leave memory failed: %r", fut.exception())


def _fail(fut: asyncio.Future[Any], error: BaseException) -> None:
    if not fut.done():
        fut.set_exception(error)


class Snapshots(Protocol):
    """Job snapshots written with the counters (implemented by ``replica.local``)."""

    def due(self, state: JobState) -> bool: ...

    def force(self, job: str) -> None: ...

    def take(self, state: JobState) -> tuple[Uncommitted, bytes]:
        """Counters and snapshot under the job's locks; counts the commit in ``committing``."""
        ...

    def write(self, session: Session, job: str, body: bytes) -> None: ...


class Committer:
    """Group commit of ingest accounting. Runs in the event loop; writes in a worker thread."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        interval_s: float = 0.0,
        lease: Lease | None = None,
        snapshots: Snapshots | None = None,
        refused: Callable[[Row], None] = lambda row: None,
        *,
        busy_interval_s: float | None = None,
        busy_envelopes: int = 8,
    ) -> None:
        self.sessions = sessions
        self.interval_s = interval_s  # least time between two transactions
        # while a transaction carries at least busy_envelopes answers, the next waits longer:
        # fewer, larger commits and groups when it is busy; light load keeps interval_s
        self.busy_interval_s = interval_s if busy_interval_s is None else busy_interval_s
        self.busy_envelopes = busy_envelopes
        self.lease = lease  # when it is lost, nothing more is written
        self.snapshots = snapshots
        self.refused = refused  # called for each row the database refused for good
        # (job, its future, what it gets once the commit is written)
        self._waiting: list[tuple[JobState, asyncio.Future[Any], Any]] = []
        self._queued: dict[int, tuple[JobState, list[Queued]]] = {}  # by id(state)
        self.queued_bytes = 0  # of the v2 envelopes waiting to be applied
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the commit loop's, once it runs
        self.commits = 0  # transactions written

    async def committed(self, state: JobState) -> None:
        """Return once everything ``state`` holds now is written (raises Unavailable)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((state, fut, None))
        self._kick()
        await fut

    def queue_v2(
        self, state: JobState, header: dict[str, Any], body: bytes, layout: Layout
    ) -> asyncio.Future[ApplyResult]:
        """Queue a v2 envelope (header checked), in call order, to be applied together with
        every other of its job that comes before the next commit (:func:`v2apply.apply_v2_many`);
        the future gets its result once that commit is written, or what applying or writing
        raised (UnknownTopology, Unavailable). The group costs a fraction per envelope of one
        applied alone; the answer waits for the commit either way."""
        fut: asyncio.Future[ApplyResult] = asyncio.get_running_loop().create_future()
        entry = self._queued.get(id(state))  # the entry holds the state: its id stays its own
        if entry is None:
            entry = self._queued[id(state)] = (state, [])
        entry[1].append(Queued(header, body, layout, fut))
        self.queued_bytes += len(body)
        self._kick()
        return fut

    def save(self, states: list[JobState]) -> None:
        """Write these jobs' snapshots with the next commit, though nothing of theirs waits
        (the job registry, before they may leave memory); from any thread."""
        loop = self._loop
        if self.snapshots is None or loop is None:
            return
        for state in states:
            self.snapshots.force(state.job)
        loop.call_soon_threadsafe(self._save_now, states)

    def _save_now(self, states: list[JobState]) -> None:
        for state in states:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            fut.add_done_callback(_retrieved)  # nobody waits for it: a failure is only logged
            self._waiting.append((state, fut, None))
        self._kick()

    def _kick(self) -> None:
        if self._wake is None:
            self._wake = asyncio.Event()
        self._wake.set()

    def _apply_queued(self, error: Exception | None) -> None:
        """Apply the queued v2 envelopes, a group per job (in the event loop: no thread hop and
        no GIL hand-over per group); their futures wait for this commit. With ``error`` (the
        lease is lost), nothing is applied and they get the error."""
        queued, self._queued, self.queued_bytes = self._queued, {}, 0
        for state, items in queued.values():
            if error is not None:
                for q in items:
                    _fail(q.future, error)
                continue
            try:
                with state.lock:
                    results = apply_v2_many(state, [(q.header, q.body, q.layout) for q in items])
            except Exception as exc:  # noqa: BLE001 - a bug: never leave a request waiting
                log.exception("job %s: applying %d v2 envelopes failed", state.job, len(items))
                for q in items:
                    _fail(q.future, exc)
                continue
            for q, result in zip(items, results, strict=True):
                if isinstance(result, UnknownTopology):
                    _fail(q.future, result)
                else:
                    self._waiting.append((state, q.future, result))

    async def run(self) -> None:
        """The commit loop (a task of the app's lifespan)."""
        if self._wake is None:
            self._wake = asyncio.Event()
        loop = self._loop = asyncio.get_running_loop()
        last = -float("inf")
        interval = self.interval_s
        while True:
            await self._wake.wait()
            pause = last + interval - loop.time()
            if pause > 0:  # gather what arrives meanwhile into this transaction
                await asyncio.sleep(pause)
            self._wake.clear()
            last = loop.time()
            lost = self.lease.lost if self.lease is not None else None
            lease_error = Unavailable(lost, headers={"Retry-After": "5"}) if lost else None
            self._apply_queued(lease_error)
            batch, self._waiting = self._waiting, []
            busy = len(batch) >= self.busy_envelopes
            interval = self.busy_interval_s if busy else self.interval_s
            if not batch:
                continue
            if lease_error is not None:
                for _, fut, _ in batch:
                    _fail(fut, lease_error)
                continue
            states = list({id(s): s for s, _, _ in batch}.values())
            try:
                await run_in_threadpool(self.write, states)
            except (SQLAlchemyError, LeaseLost) as exc:
                error = exc if isinstance(exc, LeaseLost) else Unavailable(  # fenced off: 503
                    f"storage unavailable ({type(exc).__name__}); retry later",
                    headers={"Retry-After": "2"},
                )  # fmt: skip
                for _, fut, _ in batch:
                    _fail(fut, error)
                continue
            except Exception as exc:  # noqa: BLE001 - never leave a request waiting
                log.exception("ingest commit failed")
                for _, fut, _ in batch:
                    _fail(fut, exc)
                continue
            for _, fut, value in batch:
                if not fut.done():
                    fut.set_result(value)

    def write(self, states: list[JobState]) -> None:
        """One transaction for everything the given jobs accumulated; a job's part that the
        database refuses for good is written row by row (:mod:`.salvage`)."""
        taken: list[tuple[JobState, Uncommitted, bytes | None]] = []
        for state in states:
            if self.snapshots is not None and self.snapshots.due(state):
                taken.append((state, *self.snapshots.take(state)))
                continue
            with state.lock:
                state.committing += 1
                taken.append((state, take_uncommitted(state), None))
        try:
            with session_scope(self.sessions) as session:
                for _, u, body in taken:  # a job the database refuses does not block the others
                    also = None if body is None else self._snapshot(u.job, body)
                    store(session, u, self.refused, also)
        except BaseException:
            for state, u, body in taken:
                with state.lock:
                    restore(state, u)
                    state.committing -= 1
                    state.unsaved = state.unsaved or body is not None  # not written after all
            raise
        self.commits += 1
        for state, _, _ in taken:
            with state.lock:
                state.persisted = True
                state.committing -= 1

    def _snapshot(self, job: str, body: bytes) -> Callable[[Session], None]:
        snapshots = self.snapshots
        assert snapshots is not None
        return lambda session: snapshots.write(session, job, body)
