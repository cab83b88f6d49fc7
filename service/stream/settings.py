"""Bounds on a job's in-memory event-time state (``FAILSLOW_STATE__*``)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class StateSettings(BaseModel):
    """Bounds on per-job in-memory state. See docs/memory.md for the arithmetic."""

    retention_s: float = Field(
        default=300.0, gt=0, description="Event-time window kept for assembly and idempotency."
    )
    max_pending_collectives: int = Field(
        default=200_000, gt=0, description="Per job: collectives being assembled at once."
    )
    max_done_collectives: int = Field(
        default=200_000, gt=0, description="Per job: completed collectives remembered for re-sends."
    )
    max_open_frames: int = Field(
        default=64, gt=0, description="Per job: steps (frames) being assembled at once."
    )
    max_ranks: int = Field(default=200_000, gt=0, description="Per job: largest world size.")
    max_comms: int = Field(default=100_000, gt=0, description="Per job: most communicators.")
    max_jobs: int = Field(default=1_000, gt=0, description="Jobs held in memory at once.")
    frame_grace_s: float = Field(
        default=5.0,
        ge=0,
        description="Event time after a step's last record before it is closed with missing ranks.",
    )
    time_frame_s: float = Field(
        default=1.0, gt=0, description="Frame length for jobs that send no step records."
    )
    stale_after_s: float = Field(
        default=30.0, gt=0, description="A host with no envelope for this long is stale."
    )
    evict_after_s: float = Field(
        default=6 * 3600.0, gt=0, description="Wall time after which an idle job leaves memory."
    )
