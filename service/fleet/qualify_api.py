"""``/v1/fleet/qualifications``: qualify hosts before work (go / no-go with reasons), and the node
agents' side of it (``/v1/fleet/agents/{host}/tasks``). See :mod:`.qualify` and docs/fleet.md."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from failslow.detectors.fleet import PartKind, PartState
from failslow.service.context import CtxDep, HostId, IngestAuth, OperatorAuth, ReadAuth, SessionDep
from failslow.service.errors import NotFound
from failslow.service.fleet.models import FleetPart
from failslow.service.ids import IDENTIFIER

router = APIRouter(prefix="/v1/fleet", tags=["fleet"])

RunId = Annotated[str, Path(max_length=40)]


class QualifyIn(BaseModel):
    hosts: list[Annotated[str, Field(pattern=IDENTIFIER)]] = Field(
        min_length=1, max_length=1000, description="Hosts to qualify (their node agents run it)."
    )
    timeout_s: float = Field(default=60.0, ge=1, le=600, description="Wait this long for agents.")
    bytes: int = Field(default=8 << 20, ge=1 << 16, le=64 << 20, description="Link test size.")
    iterations: int = Field(default=20, ge=1, le=10_000, description="Compute test length.")


class GpuResult(BaseModel):
    index: int = Field(ge=0, le=1023, description="The GPU's index on its host.")
    uuid: str | None = Field(default=None, max_length=80, description="Its UUID (NVML's form).")
    device: str | None = Field(default=None, max_length=200,
                               description="What it is, e.g. `cuda: NVIDIA H100 80GB HBM3`.")
    seconds: float = Field(ge=0, description="Its time for the fixed loop.")


class TaskResult(BaseModel):
    seconds: float | None = Field(default=None, ge=0,
                                  description="compute: its time (the slowest GPU's on GPUs).")
    device: str | None = Field(default=None, max_length=200,
                               description="compute: what was measured (`cpu: <model>`, "
                               "`cuda: <model>`); judged against that model's norm only.")
    gpus: list[GpuResult] | None = Field(default=None, max_length=64,
                                         description="compute on a GPU node: each GPU's.")
    bps: float | None = Field(default=None, ge=0, description="link: the slower direction.")
    up_bps: float | None = Field(default=None, ge=0)
    down_bps: float | None = Field(default=None, ge=0)
    error: str | None = Field(default=None, max_length=1000)


def standing(s: Session, hosts: list[str]) -> dict[str, list[str]]:
    """What the ledger holds against each host: its own standing, its flagged parts."""
    out: dict[str, list[str]] = {h: [] for h in hosts}
    rows = s.scalars(select(FleetPart).where(FleetPart.host.in_(hosts)))
    for p in rows:
        if p.kind == PartKind.HOST and p.state in (PartState.FAILED, PartState.SUSPECT):
            out[p.host].append(f"fleet ledger: {p.state} ({p.state_reason})"[:300])
        elif p.kind != PartKind.HOST and (p.flagged or p.state == PartState.FAILED):
            why = "; ".join((p.health or {}).get("reasons", [])) or p.state_reason  # type: ignore[arg-type]
            out[p.host].append(f"fleet ledger: {p.kind} {p.part_id} {p.state}: {why}"[:300])
    return out


@router.post("/qualifications", status_code=201, dependencies=[OperatorAuth])
def start(body: QualifyIn, ctx: CtxDep, session: SessionDep) -> dict[str, Any]:
    """Start qualifying hosts: each agent runs a compute check and link checks to its ring
    neighbours; read the verdicts with ``GET /v1/fleet/qualifications/{id}``."""
    hosts = list(dict.fromkeys(body.hosts))
    run = ctx.fleet.qualifier.start(hosts, timeout_s=body.timeout_s, nbytes=body.bytes,
                                    iterations=body.iterations,
                                    standing=standing(session, hosts))  # fmt: skip
    session.close()  # (its read is over: the run is written in a transaction of its own)
    view = ctx.fleet.qualifier.view(run)
    assert view is not None
    return view


@router.get("/qualifications/{run}", dependencies=[ReadAuth])
def get_run(run: RunId, ctx: CtxDep) -> dict[str, Any]:
    """A qualification: ``running`` until every check answered or the timeout passed, then
    ``done`` with each host's ``go`` / ``no-go`` and the reasons."""
    view = ctx.fleet.qualifier.view(run)
    if view is None:
        raise NotFound(f"no qualification {run!r} (the newest fleet.qualify_keep_runs are kept)")
    return view


@router.get("/agents/{host}/tasks", dependencies=[IngestAuth])
def agent_tasks(host: HostId, ctx: CtxDep,
                probe_addr: Annotated[str | None, Query(max_length=128)] = None,
                ) -> dict[str, Any]:  # fmt: skip
    """A node agent's qualification checks to run now (``probe_addr``: its echo endpoint)."""
    return {"tasks": ctx.fleet.qualifier.poll(host, probe_addr), "poll_s": 1.0}


@router.post("/qualifications/{run}/tasks/{task}", status_code=204, dependencies=[IngestAuth])
def report(run: RunId, task: Annotated[str, Path(max_length=40)], body: TaskResult,
           ctx: CtxDep) -> None:  # fmt: skip
    result = body.model_dump(exclude_none=True)
    if body.bps is None and body.up_bps is not None and body.down_bps is not None:
        result["bps"] = min(body.up_bps, body.down_bps)
    if not ctx.fleet.qualifier.report(run, task, result):
        raise NotFound(f"no open task {task!r} in qualification {run!r}")
