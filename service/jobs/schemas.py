"""Job and rank representations on the wire (spec section 2)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, computed_field

from failslow.service.ids import rfc3339
from failslow.service.stream.reading import JobStateName, RankState


class JobSummary(BaseModel):
    job: str
    world_size: int | None
    hosts: int
    state: JobStateName
    step: int | None = Field(description="Newest step analysed (null without step records).")
    step_time_s: float | None
    baseline_step_time_s: float | None
    slowdown: float | None
    open_incidents: int
    first_seen_ns: int
    last_seen_ns: int
    watermark_ns: int = Field(description="Detection has consumed all telemetry up to here.")

    @computed_field(description="first_seen_ns as RFC 3339 (UTC).")  # type: ignore[prop-decorator]
    @property
    def first_seen(self) -> str | None:
        return rfc3339(self.first_seen_ns or None)

    @computed_field(description="last_seen_ns as RFC 3339 (UTC).")  # type: ignore[prop-decorator]
    @property
    def last_seen(self) -> str | None:
        return rfc3339(self.last_seen_ns or None)


class JobDetail(JobSummary):
    ranks: int
    comms: int
    detector: dict[str, Any] = Field(description="Detector state worth showing.")
    ingest: dict[str, Any] = Field(description="Durable ingest counters per host.")


class RankOut(BaseModel):
    rank: int
    host: str | None
    gpu: int | None
    state: RankState
    score: float | None = Field(
        description="Speed relative to peers: 1.0 typical, 0.5 = twice as slow."
    )
    lateness_s: float | None = Field(description="Mean time peers waited for this rank per step.")
