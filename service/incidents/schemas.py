"""Incident representation on the wire (spec section 2)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field

from failslow.detectors.vocab import IncidentKind, Severity
from failslow.service.incidents.models import IncidentResolution, IncidentState


class IncidentFilter(StrEnum):
    """Which incidents a list returns."""

    OPEN = "open"
    RESOLVED = "resolved"
    ALL = "all"


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
    severity: Severity = Field(
        default=Severity.MAJOR,
        description="The incident's cost to the job now: minor below a 1.05x job slowdown "
        "(notified, never acted on), critical from 1.5x and for every hang, major between "
        "(FAILSLOW_DETECTION__MAJOR_SLOWDOWN, __CRITICAL_SLOWDOWN).",
    )
    onset_ns: int = Field(description="When the condition began (dated after the fact).")
    detected_ns: int = Field(description="Event time of the newest telemetry the decision used.")
    resolved_ns: int | None
    onset_step: int | None
    detected_step: int | None
    resolved_step: int | None = None
    summary: str
    evidence: dict[str, Any]
    updated_ns: int | None = None
    resolution: IncidentResolution | None = Field(
        default=None,
        description="How it ended: recovered (the data showed it gone), manual (an operator "
        "resolved it; evidence.resolution says who and why) or stale (its job stopped "
        "reporting). Null while open.",
    )
    onset: str | None = Field(default=None, description="onset_ns as RFC 3339 (UTC).")
    detected: str | None = Field(default=None, description="detected_ns as RFC 3339 (UTC).")
    resolved: str | None = Field(default=None, description="resolved_ns as RFC 3339 (UTC).")
