"""Incident representation on the wire (spec section 2)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

IncidentKind = Literal["slow_gpu", "slow_node", "slow_link", "hang", "job_slowdown"]
IncidentState = Literal["open", "resolved"]


class IncidentOut(BaseModel):
    id: str = Field(description="Incident id, sortable by creation time.")
    job: str
    kind: IncidentKind
    ranks: list[int] = Field(description="Culprit ranks (for a hang: the root ranks).")
    hosts: list[str] = Field(description="Hosts of the culprits (one or two for slow_link).")
    state: IncidentState
    slowdown: float | None = Field(description="Job step time now / before onset.")
    subject_slowdown: float | None = Field(description="The culprit's own slowdown factor.")
    confidence: float
    onset_ns: int = Field(description="When the condition began (dated after the fact).")
    detected_ns: int = Field(description="Event time of the newest telemetry the decision used.")
    resolved_ns: int | None
    onset_step: int | None
    detected_step: int | None
    resolved_step: int | None = None
    summary: str
    evidence: dict[str, Any]
    updated_ns: int | None = None
