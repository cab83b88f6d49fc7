"""Plan versions: the current plan of a job and publishing a new one (caller owns the transaction).

A plan is a whole document; each version is derived from the previous one by one change, so the
training job can always apply the newest version alone. Versions only grow.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from failslow.service.errors import Conflict
from failslow.service.plans.models import JobWorkload, PlanVersion

EMPTY: dict[str, Any] = {
    "microbatch_shares": None,
    "excluded_hosts": [],
    "excluded_ranks": [],
    "rank_order": {},
    "restart_epoch": 0,
    "reason": "initial plan: no changes",
}


Change = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]


def newest(session: Session, *, job: str) -> PlanVersion | None:
    """The newest published version (None: the job runs the implicit initial plan)."""
    return session.scalars(
        select(PlanVersion)
        .where(PlanVersion.job_id == job)
        .order_by(PlanVersion.version.desc())
        .limit(1)
    ).first()


def current(session: Session, *, job: str) -> tuple[int, dict[str, Any], int]:
    """``(version, body, created_ns)``; version 0 is the implicit initial plan."""
    row = newest(session, job=job)
    if row is None:
        return 0, dict(EMPTY), 0
    return row.version, {**EMPTY, **row.body}, row.created_ns


def version(session: Session, *, job: str, version: int) -> PlanVersion | None:
    return session.get(PlanVersion, (job, version))


def etag(job: str, version: int) -> str:
    digest = hashlib.sha256(f"{job}\0{version}".encode()).hexdigest()[:16]
    return f'"{version}-{digest}"'


def publish(
    session: Session,
    *,
    job: str,
    change: Change,
    reason: str,
    action_id: str | None,
    now_ns: int,
) -> tuple[int, bool]:
    """Publish ``current + change`` as a new version. Returns ``(version, created)``.

    ``change`` is the fields to replace, or a function of the current body returning them
    (for changes that build on it: adding an excluded host, merging ring orders), evaluated
    on the version it is published on top of, so a concurrent writer's change is never lost.

    Idempotent per action: if the action already published a version, that version is returned.
    Two writers racing for the same version number: the loser retries on top of the winner.
    """
    if action_id is not None:
        done = session.scalars(
            select(PlanVersion).where(PlanVersion.action_id == action_id)
        ).first()
        if done is not None:
            return done.version, False
    for _ in range(5):
        version, body, _ = current(session, job=job)
        fields = change(body) if callable(change) else change
        new = {**body, **fields, "reason": reason}
        row = PlanVersion(
            job_id=job,
            version=version + 1,
            body=new,
            reason=reason,
            action_id=action_id,
            created_ns=now_ns,
        )
        try:
            with session.begin_nested():
                session.add(row)
                session.flush()
        except IntegrityError:
            if action_id is not None:
                done = session.scalars(
                    select(PlanVersion).where(PlanVersion.action_id == action_id)
                ).first()
                if done is not None:
                    return done.version, False
            continue
        return version + 1, True
    raise RuntimeError(f"could not publish a plan for {job}: too many concurrent writers")


def acknowledge(
    session: Session, *, job: str, version: int, step: int, now_ns: int
) -> PlanVersion | None:
    """The job runs ``version`` from ``step`` on. Idempotent; a different step is a conflict."""
    row = session.get(PlanVersion, (job, version))
    if row is None:
        return None
    if row.applied_step is not None and row.applied_step != step:
        raise Conflict(
            f"plan version {version} of {job} was acknowledged from step {row.applied_step}"
        )
    row.applied_step, row.applied_ns = step, row.applied_ns or now_ns
    return row


def applied_shares(session: Session, *, job: str) -> tuple[list[int], int | None] | None:
    """The micro-batch shares the job runs under and the step it applied them from.

    The newest acknowledged version decides; a newer version that was never acknowledged is
    assumed applied as well (with no step: from now), so that a job whose client does not
    acknowledge is not compared against shares it no longer runs.
    """
    row = newest(session, job=job)
    shares = (row.body or {}).get("microbatch_shares") if row is not None else None
    if row is None or not shares:
        return None
    return list(shares), row.applied_step


def history(session: Session, *, job: str) -> list[PlanVersion]:
    return list(
        session.scalars(
            select(PlanVersion).where(PlanVersion.job_id == job).order_by(PlanVersion.version)
        )
    )


def workload(session: Session, *, job: str) -> JobWorkload | None:
    return session.get(JobWorkload, job)


def declare_workload(
    session: Session, *, job: str, global_batch: int, unit: str, now_ns: int
) -> JobWorkload:
    row = session.get(JobWorkload, job)
    if row is None:
        row = JobWorkload(job_id=job, global_batch=global_batch, unit=unit, updated_ns=now_ns)
        session.add(row)
    else:
        row.global_batch, row.unit, row.updated_ns = global_batch, unit, now_ns
    return row
