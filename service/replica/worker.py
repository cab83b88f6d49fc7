"""One owned partition: resume its jobs, then apply the stream to them and commit.

Resuming: claim the partition in the database with the epoch of the NATS claim (an older owner's
commits fail from then on: :class:`~failslow.service.replica.store.Fenced`), restore each job's
snapshot, and read the stream from the oldest point any job needs. A message at or before a
job's snapshot is skipped (the snapshot holds it); one after the snapshot but at or before the
job's committed position is applied without counting it again (its counters are stored); the
rest are applied and counted. Every batch taken from the stream is committed in one transaction
(counters, per-agent positions, snapshots when due, the partition's position) before the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import orjson
from nats.errors import Error as NatsError
from nats.js import api
from sqlalchemy.exc import SQLAlchemyError

from failslow.service.bus.client import HDR_HOST, HDR_JOB, HDR_KIND, Bus, MessageKind
from failslow.service.db import session_scope
from failslow.service.ingest.admission import record_metrics
from failslow.service.ingest.envelope import parse_envelope
from failslow.service.jobs.service import restore, take_uncommitted
from failslow.service.replica import snapshot, store
from failslow.service.replica.context import Owned
from failslow.service.stream import columnar, v2apply
from failslow.service.stream.columnar import UnknownTopology
from failslow.service.stream.state import ApplyResult, JobState
from failslow.wire import v2

log = logging.getLogger(__name__)
UNSUBSCRIBE_TIMEOUT_S = 5.0  # leaving a partition: the most its subscription's end may take


class PartitionWorker:
    def __init__(self, owned: Owned, partition: int, epoch: int) -> None:
        self.o = owned
        self.partition = partition
        self.epoch = epoch
        self.ready = False  # reading the stream: its jobs are held here
        self.resumed = False  # claimed and restored: it may commit
        self.position = 0  # committed through this stream sequence
        self.through = 0  # applied through this stream sequence
        self.skip: dict[str, int] = {}  # job -> its snapshot's sequence
        self.counted: dict[str, int] = {}  # job -> committed through
        self.snapped: dict[str, int] = {}  # job -> sequence of its newest snapshot
        self.applied: dict[str, int] = {}  # job -> newest sequence applied, uncommitted
        self.next_snapshot = 0.0
        self.lock = asyncio.Lock()  # one batch (apply + commit) at a time
        self.last_msg: Any = None

    @property
    def bus(self) -> Bus:
        return self.o.bus

    # -- resuming ---------------------------------------------------------------------------
    def resume(self) -> int:
        """Claim, restore the snapshots; the first stream sequence to read (in a thread)."""
        o = self.o
        with session_scope(o.sessions) as s:
            self.position = store.claim(s, partition=self.partition, owner=self.bus.replica,
                                        epoch=self.epoch)  # fmt: skip
            points = store.resume_points(s, partition=self.partition)
        start = self.position
        for pt in points:
            self.counted[pt.job] = pt.committed_seq
            try:
                state, rt = snapshot.loads(pt.body, o.state_settings)
            except snapshot.Incompatible as exc:
                log.warning("job %s: %s; resuming from its stored counters", pt.job, exc)
                self.skip[pt.job] = pt.committed_seq
                o.jobs.drop(pt.job)
                continue
            self.skip[pt.job] = self.snapped[pt.job] = pt.snapshot_seq
            start = min(start, pt.snapshot_seq)
            o.jobs.adopt(pt.job, state)
            if rt is not None:
                o.detection.adopt(pt.job, rt)
        self.through = start
        log.info("partition %d resumed at epoch %d: %d jobs, reading from %d (committed %d)",
                 self.partition, self.epoch, len(points), start + 1, self.position)  # fmt: skip
        return start + 1

    # -- the loop ---------------------------------------------------------------------------
    async def run(self) -> None:
        start = await asyncio.to_thread(self.resume)
        self.resumed = True
        # the partitions' messages interleave in one stream: sequence gaps are normal; what
        # can be lost is what expired before this owner needed it
        first = int((await self.bus.js.stream_info(self.bus.settings.stream)).state.first_seq)
        if start > 1 and first > start:
            log.error("partition %d: the stream dropped sequences %d..%d before they were "
                      "applied (max_age_s)", self.partition, start, first - 1)  # fmt: skip
            self.o.expired(first - start)
        cfg = api.ConsumerConfig(
            deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start,
            ack_policy=api.AckPolicy.ALL, max_ack_pending=-1, inactive_threshold=60.0,
        )  # fmt: skip
        sub = await self.bus.js.pull_subscribe(
            self.bus.subject(self.partition), stream=self.bus.settings.stream, config=cfg
        )
        self.ready = True
        self.next_snapshot = time.monotonic() + self.o.bus_settings.snapshot_every_s
        committed = time.monotonic()
        try:
            while True:
                try:
                    msgs = await sub.fetch(batch=self.o.bus_settings.fetch_batch, timeout=0.5)
                except TimeoutError:
                    msgs = []
                except NatsError as exc:
                    log.warning("partition %d: fetch failed (%r)", self.partition, exc)
                    await asyncio.sleep(0.5)
                    continue
                async with self.lock:
                    if msgs:
                        await asyncio.to_thread(self.apply, msgs)
                        self.last_msg = msgs[-1]
                    now = time.monotonic()
                    if now - committed >= self.o.bus_settings.commit_interval_s:
                        await self.commit(all_due=now >= self.next_snapshot)
                        committed = now
        finally:
            self.ready = False
            with contextlib.suppress(Exception):  # bounded: a dead server must not hold a stop
                await asyncio.wait_for(sub.unsubscribe(), UNSUBSCRIBE_TIMEOUT_S)

    def apply(self, msgs: list[Any]) -> None:
        """Apply messages in stream order; consecutive v2 envelopes of one job (all counted
        before, or none) are applied together (:func:`v2apply.apply_v2_many`)."""
        run: list[tuple[int, str, bytes]] = []  # (seq, host, body) of one job's v2 envelopes
        key = ("", False)  # the run's (job, counted before)
        for msg in msgs:
            seq = int(msg.metadata.sequence.stream)
            if seq <= self.through:  # delivered again
                continue
            h = msg.headers or {}
            job, host = h.get(HDR_JOB, ""), h.get(HDR_HOST, "")
            if seq > self.skip.get(job, 0):
                kind = MessageKind(h.get(HDR_KIND))
                mine = (job, seq <= self.counted.get(job, 0))
                if run and (kind is not MessageKind.V2 or mine != key):
                    self._guarded(key[0], len(run), self.apply_v2_run, *key, run)
                    run = []
                if kind is MessageKind.V2:
                    run.append((seq, host, msg.data))
                    key = mine
                else:
                    self._guarded(job, 1, self.apply_one, seq, kind, job, host, msg.data)
            self.through = seq
        if run:
            self._guarded(key[0], len(run), self.apply_v2_run, *key, run)

    def _guarded(self, job: str, messages: int, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - one bad message must not stop the partition
            log.exception("partition %d: %d message(s) of job %r not applied",
                          self.partition, messages, job)  # fmt: skip
            self.o.failed(messages)

    def apply_v2_run(self, job: str, counted: bool, run: list[tuple[int, str, bytes]]) -> None:
        """Apply v2 envelopes of one job together; ``counted``: committed before (applied again
        for the job's memory, not counted twice)."""
        o = self.o
        state = o.jobs.get_or_load(job)
        decoded = [(host, body, *v2.decode_header(body)) for _, host, body in run]
        with state.lock:
            results = v2apply.apply_v2_many(state, [(hd, b, lay) for _, b, hd, lay in decoded])
            for (host, _, header, layout), result in zip(decoded, results, strict=True):
                if isinstance(result, UnknownTopology):
                    log.warning("job %s host %s: envelope names an unknown topology; rejected",
                                job, host)  # fmt: skip
                    state.reject_whole(host, header["sent_ns"], layout.collectives + layout.steps)
            if counted:
                state.deltas = {}  # committed before: counted once already
        self.applied[job] = run[-1][0]
        if not counted:
            for result in results:
                if not isinstance(result, UnknownTopology):
                    record_metrics(o.metrics, result)

    def apply_one(self, seq: int, kind: MessageKind, job: str, host: str, body: bytes) -> None:
        o = self.o
        state = o.jobs.get_or_load(job)
        with state.lock:
            result = _apply(state, kind, host, body)
            if seq <= self.counted.get(job, 0):
                state.deltas = {}  # committed before: counted once already
                result = None
        self.applied[job] = seq
        if result is not None:
            record_metrics(o.metrics, result)

    async def commit(self, *, all_due: bool = False) -> None:
        """Write what was applied (and, when due, every job's snapshot)."""
        if all_due:
            self.next_snapshot = time.monotonic() + self.o.bus_settings.snapshot_every_s
            for job, seq in self.counted.items():
                if self.snapped.get(job, 0) < seq and job not in self.applied:
                    self.applied[job] = seq
        if not self.applied and self.through <= self.position:
            return
        await asyncio.to_thread(self._commit, all_due)
        if self.last_msg is not None:
            with contextlib.suppress(NatsError):  # re-delivered ones are skipped by sequence
                await self.last_msg.ack()  # AckAll: everything up to it

    def _commit(self, all_due: bool) -> None:
        o, taken = self.o, []
        for job, seq in self.applied.items():
            state = o.jobs.get(job)
            if state is None:
                continue
            due = all_due or job not in self.snapped
            rt = o.detection.existing(job) if due else None
            # a snapshot takes both locks, in detection's order, so that the two agree
            with rt.lock if rt is not None else contextlib.nullcontext(), state.lock:
                u = take_uncommitted(state)
                body = snapshot.dumps(state, rt) if due else None
            taken.append((state, store.JobCommit(u, self.partition, seq, body)))
        try:
            with session_scope(o.sessions) as s:
                store.commit(s, partition=self.partition, epoch=self.epoch,
                             position=self.through, jobs=[jc for _, jc in taken],
                             refused=o.metrics.refused_row)  # fmt: skip
        except (SQLAlchemyError, store.Fenced):
            for state, jc in taken:
                with state.lock:
                    restore(state, jc.u)
            raise
        for state, jc in taken:
            state.persisted = True
            self.counted[jc.u.job] = jc.seq
            if jc.snapshot is not None:
                self.snapped[jc.u.job] = jc.seq
        self.applied.clear()
        self.position = self.through

    def jobs(self) -> list[str]:
        return [s.job for s in self.o.jobs.all() if self.bus.partition(s.job) == self.partition]


def _apply(state: JobState, kind: MessageKind, host: str, body: bytes) -> ApplyResult | None:
    """Apply one v1 envelope or registration as the HTTP path would have (under the job
    lock); v2 envelopes go in runs (:meth:`PartitionWorker.apply_v2_run`)."""
    if kind is MessageKind.V1:
        return state.apply(parse_envelope(orjson.loads(body)))
    reg = orjson.loads(body)
    state.topology.touch_host(host, reg["sent_ns"], time.monotonic())
    try:
        columnar.register_topology(state, host, reg["ranks"], reg["comms"])
    except columnar.RegistrationError as exc:
        log.warning("job %s host %s: registration refused by the owner: %s", state.job, host,
                    exc.errors)  # fmt: skip
    return None
