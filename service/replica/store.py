"""The replicas' rows: claiming a partition (fencing), committing what an owner applied, and
reading what a new owner resumes from. Callers own the transaction."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from failslow.service.ingest import salvage
from failslow.service.ingest.salvage import Row
from failslow.service.jobs.service import Uncommitted
from failslow.service.replica.models import BusPartition, JobSnapshot

P = BusPartition.__table__
S = JobSnapshot.__table__


class Fenced(Exception):
    """Another replica claimed the partition with a newer epoch: this one must stop writing."""


@dataclass(slots=True)
class JobCommit:
    """What one job applied since its last commit."""

    u: Uncommitted
    partition: int
    seq: int  # the last stream message applied to the job
    snapshot: bytes | None = None  # its state as of ``seq``, when one is due


@dataclass(frozen=True, slots=True)
class Resume:
    job: str
    committed_seq: int
    snapshot_seq: int
    body: bytes


def claim(session: Session, *, partition: int, owner: str, epoch: int) -> int:
    """Make ``owner`` the writer of ``partition`` from ``epoch`` on; its position. Raises
    :class:`Fenced` when a newer epoch already holds it."""
    now = time.time_ns()
    done = session.execute(
        update(P).where(P.c.partition == partition, P.c.epoch <= epoch)
        .values(owner=owner, epoch=epoch, updated_ns=now)
    ).rowcount  # fmt: skip
    if not done:
        row = session.execute(select(P.c.epoch).where(P.c.partition == partition)).first()
        if row is not None:
            raise Fenced(f"partition {partition} is held at epoch {row[0]} > {epoch}")
        try:
            with session.begin_nested():
                session.execute(insert(P).values(partition=partition, owner=owner, epoch=epoch,
                                                 position=0, updated_ns=now))  # fmt: skip
        except IntegrityError:
            raise Fenced(f"partition {partition} was claimed meanwhile") from None
    pos = session.execute(select(P.c.position).where(P.c.partition == partition)).scalar_one()
    return int(pos)


def resume_points(session: Session, *, partition: int) -> list[Resume]:
    rows = session.execute(
        select(S.c.job, S.c.committed_seq, S.c.snapshot_seq, S.c.body)
        .where(S.c.partition == partition)
    )  # fmt: skip
    return [Resume(r.job, int(r.committed_seq), int(r.snapshot_seq), r.body) for r in rows]


def commit(
    session: Session,
    *,
    partition: int,
    epoch: int,
    position: int,
    jobs: list[JobCommit],
    refused: Callable[[Row], None] = lambda row: None,
) -> None:
    """One transaction: the jobs' counters and positions, their snapshots, and the partition's
    position, only while ``epoch`` still holds the partition."""
    now = time.time_ns()
    held = session.execute(
        update(P).where(P.c.partition == partition, P.c.epoch == epoch)
        .values(position=position, updated_ns=now)
    ).rowcount  # fmt: skip
    if not held:
        raise Fenced(f"partition {partition} is no longer held at epoch {epoch}")
    for jc in jobs:
        salvage.store(session, jc.u, refused)  # what the database refuses never blocks
        values: dict[str, object] = {"committed_seq": jc.seq}
        if jc.snapshot is not None:
            values.update(snapshot_seq=jc.seq, taken_ns=now, body=jc.snapshot)
        if session.execute(update(S).where(S.c.job == jc.u.job).values(**values)).rowcount:
            continue
        if jc.snapshot is None:  # the first commit of a job always carries a snapshot
            raise ValueError(f"job {jc.u.job}: a first commit without a snapshot")
        session.execute(insert(S).values(job=jc.u.job, partition=jc.partition, **values))
