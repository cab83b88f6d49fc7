"""Without a bus: each job's state and detector state, written with its counters, so that a
restarted service resumes detection where it was.

Before, a restart rebuilt only the topology and stream positions from the database: detector
windows and baselines were gone, so a slowdown under way when the service restarted was learned
again as the job's normal. Now the ingest commit (``ingest.service.Committer``) writes a job's
snapshot (:mod:`~failslow.service.replica.snapshot`, the format the replicas use) in the same
transaction as its counters, at most every ``snapshot_every_s`` per job and for every job at a
clean shutdown; :meth:`LocalSnapshots.load` is what the job registry loads a job with.

After a crash (no final snapshot) the newest periodic one is used: detection resumes from state
up to ``snapshot_every_s`` old, with the positions, registrations and watermark the database has
now laid over it (what came after the snapshot is counted, and never re-sent by the agents, so
it is missing from detection only). A snapshot of another version of failslow is not used.
"""

from __future__ import annotations

import contextlib
import logging
import time

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from failslow.detectors.vocab import CommKind
from failslow.service.detection.engine import DetectionEngine
from failslow.service.jobs.models import AgentStream, Comm, Job, Rank
from failslow.service.jobs.service import Uncommitted, load_registrations, take_uncommitted
from failslow.service.replica import snapshot
from failslow.service.replica.models import JobSnapshot
from failslow.service.stream.records import CommAnnouncement, RankAnnouncement, RecordError
from failslow.service.stream.settings import StateSettings
from failslow.service.stream.state import JobState

log = logging.getLogger(__name__)
LOCAL = -1  # the partition of snapshots written without a bus (replicas use 0 and up)
S = JobSnapshot.__table__


class LocalSnapshots:
    def __init__(
        self, *, detection: DetectionEngine, settings: StateSettings, every_s: float
    ) -> None:
        self.detection = detection
        self.settings = settings
        self.every_s = every_s
        self._taken: dict[str, float] = {}  # job -> monotonic time of its last snapshot
        self._forced: set[str] = set()
        self.written = 0

    def force(self, job: str) -> None:
        """Take ``job``'s snapshot at its next commit, whenever the last one was."""
        self._forced.add(job)

    def due(self, state: JobState) -> bool:
        # the first one ``every_s`` after the job's first commit (a job's first moments change
        # most); then every ``every_s``
        last = self._taken.setdefault(state.job, time.monotonic())
        return state.job in self._forced or time.monotonic() - last >= self.every_s

    def take(self, state: JobState) -> tuple[Uncommitted, bytes]:
        """The job's uncommitted counters and its snapshot, taken together under both locks
        (in detection's order), so that the snapshot holds exactly what the commit counts."""
        rt = self.detection.existing(state.job)
        with rt.lock if rt is not None else contextlib.nullcontext(), state.lock:
            state.committing += 1
            u = take_uncommitted(state)
            body = snapshot.dumps(state, rt)
            state.unsaved = False  # once this commit is written (else it is set again below)
        self._taken[state.job] = time.monotonic()
        self._forced.discard(state.job)
        return u, body

    def write(self, session: Session, job: str, body: bytes) -> None:
        values = {"committed_seq": 0, "snapshot_seq": 0, "taken_ns": time.time_ns(), "body": body}
        done = session.execute(
            update(S).where(S.c.job == job, S.c.partition == LOCAL).values(**values)
        ).rowcount  # fmt: skip
        if not done:
            session.execute(insert(S).values(job=job, partition=LOCAL, **values))
        self.written += 1

    def load(self, session: Session, job: str) -> JobState | None:
        """The job from its snapshot, with the database's newer positions laid over it, and its
        detector state handed to detection; None when there is no usable snapshot."""
        row = session.execute(
            select(S.c.body).where(S.c.job == job, S.c.partition == LOCAL)
        ).first()  # fmt: skip
        stored = session.get(Job, job)
        if row is None or stored is None:
            return None
        try:
            state, rt = snapshot.loads(row.body, self.settings)
        except snapshot.Incompatible as exc:
            log.warning("job %s: snapshot not used (%s); detection starts afresh", job, exc)
            return None
        state.watermark_ns = stored.watermark_ns  # only ever moves forward
        _lay_topology_over(session, state, stored.last_seen_ns)
        for s in session.scalars(select(AgentStream).where(AgentStream.job_id == job)):
            key = (s.host, s.agent)
            state.streams[key] = max(state.streams.get(key, -1), s.last_batch_seq)
        # what the database keeps now; the ones the snapshot already holds need no restoring
        state.stored_registrations = {}
        load_registrations(session, state)
        for host, kept in state.registrations.items():
            stored = state.stored_registrations.get(host, {})
            for key in kept:
                stored.pop(key, None)
            if not stored:
                state.stored_registrations.pop(host, None)
        if rt is not None:
            self.detection.adopt(job, rt)
        self._taken[job] = time.monotonic()
        log.info("job %s: resumed from its snapshot (detector state kept)", job)
        return state


def _lay_topology_over(session: Session, state: JobState, seen_ns: int) -> None:
    """Where the database places ranks now (a rank may have moved since the snapshot) and the
    communicators announced since."""
    topo = state.topology
    for r in session.scalars(select(Rank).where(Rank.job_id == state.job)):
        info = topo.ranks.get(r.rank)
        if info is not None and info.host == r.host and (r.gpu is None or info.gpu == r.gpu):
            continue
        if r.host not in topo.hosts:
            topo.touch_host(r.host, seen_ns, state.last_wall)
        topo.announce_rank(r.host, RankAnnouncement(r.rank, r.gpu, None))
    for c in session.scalars(select(Comm).where(Comm.job_id == state.job)):
        if c.comm not in topo.comms:
            with contextlib.suppress(RecordError):  # at the limit: its hosts announce it again
                topo.announce_comm(CommAnnouncement(c.comm, CommKind(c.kind), tuple(c.ranks)))
    topo.dirty_ranks.clear()
    topo.dirty_comms.clear()
