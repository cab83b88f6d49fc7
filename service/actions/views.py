"""What the policy sees: incidents, past actions, the job and learned costs, built from the
database, the job's event-time state and detection's read interface."""

from __future__ import annotations

import statistics
import time

from sqlalchemy import select
from sqlalchemy.orm import Session

from failslow.detectors.vocab import IncidentKind, Severity
from failslow.service.actions.decisions import IncidentView, JobView, PastAction
from failslow.service.actions.models import Action
from failslow.service.actions.vocab import MEASURED, ActionKind, ActionState
from failslow.service.incidents.models import Incident, IncidentState
from failslow.service.plans import service as plans
from failslow.service.stream.reading import DetectionReader
from failslow.service.stream.registry import JobRegistry
from failslow.service.stream.roles import dp_index, rings
from failslow.service.stream.state import JobState


def incident_view(row: Incident) -> IncidentView:
    return IncidentView(
        id=row.id,
        job=row.job_id,
        kind=IncidentKind(row.kind),
        state=IncidentState(row.state),
        ranks=tuple(row.ranks),
        hosts=tuple(row.hosts),
        slowdown=row.slowdown,
        subject_slowdown=row.subject_slowdown,
        confidence=row.confidence,
        severity=Severity(row.severity),
        onset_ns=row.onset_ns,
        detected_ns=row.detected_ns,
        edges=tuple(
            (str(e[0]), str(e[1]))
            for e in (row.evidence.get("candidate_edges") or [])  # type: ignore[union-attr]
            if isinstance(e, list | tuple) and len(e) == 2
        ),
    )


def past(rows: list[Action]) -> tuple[PastAction, ...]:
    return tuple(
        PastAction(
            r.id,
            r.incident_id,
            ActionKind(r.kind),
            r.target,
            ActionState(r.state),
            r.decided_event_ns,
            r.decided_event_ns,
        )
        for r in rows
    )


def job_view(
    session: Session, *, job: str, jobs: JobRegistry, detection: DetectionReader
) -> JobView | None:
    """The job as the policy sees it (None while the job is not in memory)."""
    state = jobs.get(job)
    if state is None:
        return None
    _, plan, _ = plans.current(session, job=job)
    declared = plans.workload(session, job=job)
    with state.lock:
        topo = state.topology
        host_of = {r: i.host for r, i in topo.ranks.items() if i.host is not None}
        dp_of, dp_size = dp_index(topo)
        ring = rings(topo)
        world = topo.world_size or len(topo.ranks)
        watermark = state.watermark_ns
        stale = state.is_stale(time.monotonic())
    for comm, order in plan.get("rank_order", {}).items():
        if comm in ring:
            ring[comm] = tuple(order)
    numbers = detection.numbers(job)
    return JobView(
        job=job,
        world_size=world,
        host_of=host_of,
        watermark_ns=watermark,
        stale=stale,
        step_time_s=numbers.step_time_s if numbers is not None else None,
        baseline_step_time_s=numbers.baseline_step_time_s if numbers is not None else None,
        dp_of=dp_of,
        dp_size=dp_size,
        global_batch=declared.global_batch if declared is not None else None,
        rings=ring,
        excluded_hosts=tuple(plan.get("excluded_hosts", ())),
    )


def learned(
    session: Session,
) -> tuple[dict[str, float], dict[str, tuple[float, ...]]]:
    """Per action kind, from the newest measured outcomes of every job: the median cost,
    and the recoveries (oldest first)."""
    measured = list(
        session.scalars(
            select(Action)
            .where(Action.outcome.is_not(None), Action.kind.in_(MEASURED))
            .order_by(Action.updated_ns.desc())
            .limit(200)
        )
    )
    costs: dict[str, float] = {}
    recovered: dict[str, tuple[float, ...]] = {}
    for kind in MEASURED:
        mine = [a.outcome for a in measured if a.kind == kind and a.outcome]
        cost = [float(o["cost_s"]) for o in mine[:10] if o.get("cost_s") is not None]
        if cost:
            costs[kind] = statistics.median(cost)
        rec = [float(o["recovered"]) for o in mine[:10] if o.get("recovered") is not None]
        if rec:
            recovered[kind] = tuple(reversed(rec))
    return costs, recovered


def dp_speeds(state: JobState, detection: DetectionReader, dp_size: int) -> list[float]:
    """Per data-parallel index: the slowest member's recent speed per unit of work."""
    score = detection.rank_speed(state.job)
    if score is None or dp_size < 1:
        return []
    with state.lock:
        dp_of, _ = dp_index(state.topology)
        slots = {r: state.topology.ranks[r].slot for r in dp_of if r in state.topology.ranks}
    out = [float("inf")] * dp_size
    for r, d in dp_of.items():
        slot = slots.get(r)
        if slot is None or slot >= score.size or d >= dp_size:
            continue
        out[d] = min(out[d], float(score[slot]))
    return [v if v != float("inf") else float("nan") for v in out]
