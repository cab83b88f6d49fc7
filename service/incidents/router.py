"""``/v1/incidents``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response

from failslow.service.context import ReadAuth, SessionDep
from failslow.service.errors import NotFound
from failslow.service.incidents import service as incidents
from failslow.service.incidents.schemas import IncidentFilter, IncidentOut
from failslow.service.paging import PageDep, one_page

router = APIRouter(prefix="/v1/incidents", tags=["incidents"])


@router.get("", response_model=list[IncidentOut], dependencies=[ReadAuth], summary="All incidents")
def list_all(
    session: SessionDep,
    page: PageDep,
    request: Request,
    response: Response,
    state: Annotated[IncidentFilter, Query()] = IncidentFilter.ALL,
) -> list[IncidentOut]:
    rows = incidents.list_incidents(session, state=state, page=page)
    rows = one_page(rows, page, lambda r: r.id, request, response)
    return [incidents.to_out(r) for r in rows]


@router.get("/{id}", response_model=IncidentOut, dependencies=[ReadAuth], summary="One incident")
def get_one(id: Annotated[str, Path(max_length=40)], session: SessionDep) -> IncidentOut:  # noqa: A002
    row = incidents.get_incident(session, incident_id=id)
    if row is None:
        raise NotFound(f"no incident {id!r}")
    return incidents.to_out(row)
