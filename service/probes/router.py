"""``/v1/jobs/{job}/probes``: node agents fetch their probe tasks and report results; operators
see the campaigns; the job declares critical phases (no probes then, by default)."""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, Field

from failslow.detectors.vocab import IncidentKind
from failslow.service.context import (
    AppContext,
    CtxDep,
    IngestAuth,
    JobClientAuth,
    JobId,
    ReadAuth,
    SessionDep,
)
from failslow.service.db import get_for_update
from failslow.service.errors import Conflict, InvalidRequest, NotFound
from failslow.service.incidents.models import Incident
from failslow.service.incidents.service import add_notes
from failslow.service.jobs import service as jobs_db
from failslow.service.probes.hang_evidence import HangEvidenceIn, merge

router = APIRouter(prefix="/v1/jobs", tags=["probes"])


def _known(ctx: AppContext, job: str) -> None:
    """404 unless the job exists: a token must not create state for jobs nobody runs."""
    if ctx.jobs.get(job) is not None:
        return
    with ctx.sessions() as session:
        if jobs_db.get_job(session, job=job) is None:
            raise NotFound(f"no job {job!r}: the job's agents must send telemetry first")


def _own_address(addr: str, request: Request) -> str:
    """``addr`` (IP:port) if its IP is the one the request comes from (422 otherwise): other
    agents will send probe traffic to it, so an agent may name only itself."""
    host, sep, port = addr.rpartition(":")
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
        if not sep or not 0 < int(port) < 65536:
            raise ValueError(addr)
    except ValueError:
        raise InvalidRequest(f"probe_addr {addr!r} is not IP:port") from None
    client = request.client.host if request.client is not None else None
    try:
        same = client is not None and ipaddress.ip_address(client) == ip
    except ValueError:
        same = False
    if not same:
        raise InvalidRequest(
            f"probe_addr {addr!r} is not this agent's own address (the request comes from "
            f"{client}); behind NAT or a proxy set FAILSLOW_PROBES__OWN_ADDRESS_ONLY=false"
        )
    return addr


class ProbeTask(BaseModel):
    id: str
    peer: str = Field(description="The host to test the path to.")
    peer_addr: str = Field(description="Its agent's probe endpoint, host:port.")
    bytes: int = Field(description="Bytes to send, and to receive back.")


class ProbeResult(BaseModel):
    bps: float | None = Field(
        default=None, ge=0, description="The slower direction's bytes per second."
    )
    up_bps: float | None = Field(default=None, ge=0)
    down_bps: float | None = Field(default=None, ge=0)
    error: str | None = Field(default=None, max_length=500)


class Phase(BaseModel):
    critical: bool = Field(description="True while the job must not be disturbed (no probes).")


class HostTasks(BaseModel):
    probes: list[ProbeTask] = Field(description="Bandwidth tests to run now, one after another.")
    dumps: list[str] = Field(
        description="Hang incidents for which to collect Flight Recorder / NCCL RAS evidence."
    )
    poll_s: float = Field(description="Poll again after this many seconds.")


@router.get(
    "/{job}/hosts/{host}/tasks",
    response_model=HostTasks,
    dependencies=[IngestAuth],
    summary="What this host's agent should do now: probe tasks, hang evidence to collect",
)
def get_tasks(
    job: JobId,
    host: Annotated[str, Path(max_length=128)],
    ctx: CtxDep,
    request: Request,
    probe_addr: Annotated[str | None, Query(max_length=128)] = None,
) -> HostTasks:
    _known(ctx, job)
    if probe_addr and ctx.settings.probes.own_address_only:
        probe_addr = _own_address(probe_addr, request)
    tasks = ctx.probes.poll(job, host, probe_addr) if ctx.settings.probes.enabled else []
    return HostTasks(
        probes=[ProbeTask(**t) for t in tasks],
        dumps=ctx.probes.dumps_for(job, host),
        poll_s=1.0,
    )


@router.post(
    "/{job}/probes/{task}",
    dependencies=[IngestAuth],
    summary="Report a probe task's measurement (or its error)",
    status_code=204,
)
def post_result(job: JobId, task: str, body: ProbeResult, ctx: CtxDep) -> None:
    bps = body.bps
    if bps is None and body.up_bps is not None and body.down_bps is not None:
        bps = min(body.up_bps, body.down_bps)
    if not ctx.probes.report(job, task, bps=bps, error=body.error):
        raise NotFound(f"no running probe task {task!r} for job {job!r}")


@router.get(
    "/{job}/probes",
    dependencies=[ReadAuth],
    summary="Probe campaigns of this job, their rounds and conclusions",
)
def get_campaigns(job: JobId, ctx: CtxDep) -> dict[str, Any]:
    return ctx.probes.view(job)


@router.put(
    "/{job}/phase",
    dependencies=[JobClientAuth],
    summary="Declare whether the job is in a critical phase (no probes unless allowed)",
)
def put_phase(job: JobId, body: Phase, ctx: CtxDep) -> dict[str, Any]:
    _known(ctx, job)
    ctx.probes.set_critical(job, body.critical)
    return {"job": job, "critical": body.critical}


@router.post(
    "/{job}/incidents/{incident}/hang-evidence",
    dependencies=[IngestAuth],
    summary="An agent's Flight Recorder / NCCL RAS evidence for an open hang",
)
def post_hang_evidence(
    job: JobId,
    incident: Annotated[str, Path(max_length=40)],
    body: HangEvidenceIn,
    session: SessionDep,
) -> dict[str, Any]:
    row = get_for_update(session, Incident, incident)
    if row is None or row.job_id != job:
        raise NotFound(f"no incident {incident!r} in job {job!r}")
    if row.kind != IncidentKind.HANG:
        raise Conflict(f"incident {incident!r} is a {row.kind}, not a hang")
    before = dict(row.evidence or {})
    row.evidence = merge(before, body)
    row.summary = add_notes(row.summary, row.evidence, replacing=before)
    session.commit()
    return {"incident": incident, "flight_recorder": row.evidence.get("flight_recorder")}
