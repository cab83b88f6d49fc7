"""``/v1/fleet``: hosts, GPUs and NICs across jobs; their history; drain and return; the hosts'
hardware inventories (docs/fleet.md)."""

from __future__ import annotations

import math
import time
from enum import StrEnum
from typing import Annotated

from fastapi import APIRouter, Path, Query
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from failslow.detectors.fleet import PartKind, PartState
from failslow.service.context import (
    ActorDep,
    CtxDep,
    HostId,
    IngestAuth,
    OperatorAuth,
    ReadAuth,
    SessionDep,
)
from failslow.service.control import service as control
from failslow.service.control.schemas import AuditVerb, Because
from failslow.service.errors import Conflict, NotFound
from failslow.service.fleet import hints, standing
from failslow.service.fleet.models import FleetMark, FleetPart, FleetReading, HostInventory
from failslow.service.fleet.schemas import (
    IncidentPart,
    InventoryIn,
    InventoryOut,
    MarkOut,
    PartDetail,
    PartOut,
    PartSort,
    ReadingOut,
    ReadingSource,
)
from failslow.service.ids import rfc3339

router = APIRouter(prefix="/v1/fleet", tags=["fleet"])


class Kinds(StrEnum):
    """The plural in the URL."""

    HOSTS = "hosts"
    GPUS = "gpus"
    NICS = "nics"

    @property
    def kind(self) -> PartKind:
        return {Kinds.HOSTS: PartKind.HOST, Kinds.GPUS: PartKind.GPU, Kinds.NICS: PartKind.NIC}[
            self
        ]


PartPath = Annotated[str, Path(max_length=200, description="The part's identity.")]


def part_out(row: FleetPart) -> dict[str, object]:
    h = row.health or {}
    return dict(
        part=row.part_id, kind=row.kind, host=row.host, label=row.label, id_source=row.id_source,
        state=row.state, state_since=rfc3339(row.state_since_ns), state_reason=row.state_reason,
        flagged=row.flagged, score=float(h.get("score", 1.0)),  # type: ignore[arg-type]
        slowness=float(h.get("slowness", 1.0)),  # type: ignore[arg-type]
        slowness_low=float(h.get("low", 1.0)), slowness_high=float(h.get("high", 1.0)),  # type: ignore[arg-type]
        jobs=int(h.get("jobs", 0)), jobs_seen=row.jobs_total,  # type: ignore[call-overload]
        observed_h=round(float(h.get("observed_s", 0.0)) / 3600, 4),  # type: ignore[arg-type]
        incidents=row.incidents_total, incident_jobs=int(h.get("incident_jobs", 0)),  # type: ignore[call-overload]
        cost_s=row.cost_s, reasons=list(h.get("reasons", [])),  # type: ignore[call-overload]
        first_seen=rfc3339(row.first_seen_ns), last_seen=rfc3339(row.last_seen_ns),
    )  # fmt: skip


ORDER = {  # in SQL (with the limit): the (kind, cost) index serves the default
    PartSort.COST: (FleetPart.cost_s.desc(), FleetPart.part_id),
    PartSort.JOBS: (FleetPart.jobs_total.desc(), FleetPart.part_id),
    PartSort.NAME: (FleetPart.part_id,),
}


def by_score(p: FleetPart) -> tuple[float, str]:  # the score lives in the health JSON
    return float((p.health or {}).get("score", 1.0)), p.part_id  # type: ignore[arg-type]


@router.put("/hosts/{host}/hardware", response_model=InventoryOut, dependencies=[IngestAuth],
            tags=["fleet"])  # fmt: skip
def put_inventory(host: HostId, body: InventoryIn, session: SessionDep) -> InventoryOut:
    """What a node agent found the host runs on (its GPUs' identities, its NICs)."""
    row = session.get(HostInventory, host) or HostInventory(host=host)
    row.gpus = [g.model_dump() for g in body.gpus]
    row.nics = [n.model_dump() for n in body.nics]
    row.note, row.reported_ns = body.note, time.time_ns()
    session.add(row)
    session.commit()
    return InventoryOut(host=host, reported=rfc3339(row.reported_ns), **body.model_dump())


@router.get("/hosts/{host}/hardware", response_model=InventoryOut, dependencies=[ReadAuth])
def get_inventory(host: HostId, session: SessionDep) -> InventoryOut:
    row = session.get(HostInventory, host)
    if row is None:
        raise NotFound(f"no inventory reported for host {host!r}")
    return InventoryOut(host=host, reported=rfc3339(row.reported_ns), gpus=row.gpus,  # type: ignore[arg-type]
                        nics=row.nics, note=row.note)  # type: ignore[arg-type]  # fmt: skip


@router.post("/flush", dependencies=[OperatorAuth])
async def flush(ctx: CtxDep) -> dict[str, int]:
    """Have the ledger take what detection saw now (it does every ``fleet.flush_interval_s``)."""
    await run_in_threadpool(ctx.fleet.flush)
    return {"flushes": ctx.fleet.flushes}


@router.get("/incidents/{incident}", response_model=list[IncidentPart],
            dependencies=[ReadAuth])  # fmt: skip
def incident_parts(incident: Annotated[str, Path(max_length=40)],
                   session: SessionDep) -> list[dict[str, object]]:  # fmt: skip
    """The hardware an incident named (GPU UUIDs, hosts, NICs), once the ledger has marked it
    (within ``fleet.flush_interval_s``); empty for a job slowdown or an unmarked incident."""
    q = (select(FleetMark, FleetPart).join(FleetPart, FleetPart.part_id == FleetMark.part_id)
         .where(FleetMark.incident_id == incident).order_by(FleetMark.part_id))  # fmt: skip
    return [dict(part=p.part_id, kind=p.kind, host=p.host, label=p.label, id_source=p.id_source,
                 state=p.state, lost_s=round(m.lost_s, 3)) for m, p in session.execute(q)]


@router.get("/{kinds}", response_model=list[PartOut], dependencies=[ReadAuth])
def list_parts(
    kinds: Kinds,
    session: SessionDep,
    sort: PartSort = PartSort.COST,
    state: Annotated[PartState | None, Query(description="Only parts in this standing.")] = None,
    flagged: Annotated[bool | None, Query(description="Only flagged (or unflagged) parts.")] = None,
    host: Annotated[
        str | None, Query(max_length=128, description="Only parts on this host.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> list[dict[str, object]]:
    """The fleet's hosts, GPUs or NICs, the costliest first by default."""
    q = select(FleetPart).where(FleetPart.kind == kinds.kind)
    if state is not None:
        q = q.where(FleetPart.state == state)
    if flagged is not None:
        q = q.where(FleetPart.flagged.is_(flagged))
    if host is not None:
        q = q.where(FleetPart.host == host)
    if sort == PartSort.SCORE:
        rows = sorted(session.scalars(q), key=by_score)[:limit]
    else:
        rows = list(session.scalars(q.order_by(*ORDER[sort]).limit(limit)))
    return [part_out(r) for r in rows]


def _part(session: SessionDep, kinds: Kinds, part: str) -> FleetPart:
    row = session.get(FleetPart, part)
    if row is None or row.kind != kinds.kind:
        raise NotFound(f"no {kinds.kind} {part!r} in the fleet ledger")
    return row


@router.get("/{kinds}/{part:path}", response_model=PartDetail, dependencies=[ReadAuth])
def get_part(kinds: Kinds, part: PartPath, session: SessionDep) -> dict[str, object]:
    """One part, with its per-job readings and the incidents that named it (its history)."""
    row = _part(session, kinds, part)
    readings = session.scalars(select(FleetReading).where(FleetReading.part_id == part)
                               .order_by(FleetReading.last_ns.desc()))  # fmt: skip
    marks = session.scalars(select(FleetMark).where(FleetMark.part_id == part)
                            .order_by(FleetMark.at_ns.desc()))  # fmt: skip

    def check(r: FleetReading) -> bool:  # a NIC's link check has no observed job time
        return row.kind == PartKind.NIC and r.observed_s == 0

    return {
        **part_out(row),
        "readings": [
            ReadingOut(
                job=r.job_id,
                source=ReadingSource.LINK_CHECK if check(r) else ReadingSource.JOB,
                frames=r.n,
                ratio=round(math.exp(r.mean), 5),
                observed_s=round(r.observed_s, 3),
                lost_s=round(r.lost_s, 3),
                first_seen=rfc3339(r.first_ns),
                last_seen=rfc3339(r.last_ns),
            )  # fmt: skip
            for r in readings
        ],
        "marks": [
            MarkOut(
                incident=m.incident_id,
                job=m.job_id,
                kind=m.kind,
                severity=m.severity,
                at=rfc3339(m.at_ns),
                lost_s=round(m.lost_s, 3),
                hard=m.hard,
            )  # fmt: skip
            for m in marks
        ],
    }


def _change(session: SessionDep, kinds: Kinds, part: str, state: PartState, verb: AuditVerb,
            body: Because, actor: str, allowed: set[PartState]) -> FleetPart:  # fmt: skip
    row = _part(session, kinds, part)
    if row.state not in allowed:
        raise Conflict(f"{kinds.kind} {part!r} is {row.state}: {verb} needs one of "
                       f"{', '.join(sorted(allowed))}")  # fmt: skip
    now = max(standing.fleet_now_ns(session), row.state_since_ns + 1)
    standing.set_state(row, state, now, f"{verb} by {actor}: {body.reason}")
    control.audit(
        session,
        actor=actor,
        verb=verb,
        job=None,
        target=part,
        reason=body.reason,
        detail={"kind": str(kinds.kind), "state": str(state)},
        now_ns=time.time_ns(),
    )
    session.commit()
    return row


@router.post("/{kinds}/{part:path}/drain", response_model=PartOut, dependencies=[OperatorAuth])
def drain(kinds: Kinds, part: PartPath, body: Because, session: SessionDep, actor: ActorDep,
          ctx: CtxDep) -> dict[str, object]:  # fmt: skip
    """Take a part out of service (``failed``) until it is returned; a drain action is proposed
    for its host (``hint``), carried out by the actuator once approved."""
    row = _change(session, kinds, part, PartState.FAILED, AuditVerb.DRAIN, body, actor,
                  {PartState.HEALTHY, PartState.SUSPECT, PartState.PROBATION})  # fmt: skip
    out = part_out(row)
    job = hints.last_job(session, row.part_id)
    if ctx.fleet.propose is not None and job is not None:
        spec = hints.drain_spec(row, f"drained by {actor}: {body.reason}")
        proposed = ctx.fleet.propose(job, spec, row.state_since_ns)
        if proposed is not None:
            out["hint"] = f"{proposed[0]} ({proposed[1]})"
    return out


@router.post("/{kinds}/{part:path}/return", response_model=PartOut, dependencies=[OperatorAuth])
def give_back(kinds: Kinds, part: PartPath, body: Because, session: SessionDep, actor: ActorDep,
              ctx: CtxDep) -> dict[str, object]:  # fmt: skip
    """A part back from repair: on probation until it runs clean (``fleet.probation_s``); an
    undrain action is proposed for its host (``hint``) unless another part there is still unfit
    (``hint_skipped`` says which)."""
    row = _change(session, kinds, part, PartState.PROBATION, AuditVerb.RETURN, body, actor,
                  {PartState.FAILED, PartState.SUSPECT})  # fmt: skip
    out = part_out(row)
    job = hints.last_job(session, row.part_id)
    if ctx.fleet.propose is None or job is None:
        return out
    if still := hints.unfit_on(session, row.host):
        out["hint_skipped"] = f"{row.host} stays drained: {', '.join(still[:5])} still unfit"
        return out
    proposed = ctx.fleet.propose(job, hints.undrain_spec(row, f"by {actor}: {body.reason}"),
                                 row.state_since_ns)  # fmt: skip
    if proposed is not None:
        out["hint"] = f"{proposed[0]} ({proposed[1]})"
    return out
