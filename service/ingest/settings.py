"""Ingest limits (``FAILSLOW_INGEST__*``)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class IngestSettings(BaseModel):
    max_body_bytes: int = Field(
        default=16 * 1024 * 1024, gt=0, description="Largest envelope after decompression (413)."
    )
    max_concurrent_requests: int = Field(
        default=32, gt=0, description="Ingest requests processed at once; more get 429."
    )
    max_queued_bytes: int = Field(
        default=256 * 1024 * 1024,
        gt=0,
        description="v2 envelope bytes (decompressed) waiting to be applied with the next "
        "commit; more get 429 with Retry-After. A burst of a 100K-rank job's envelopes at a "
        "step's end is ~140 MB.",
    )
    retry_after_s: int = Field(default=1, ge=1, description="Retry-After sent with a 429.")
    commit_interval_s: float = Field(
        default=0.02,
        ge=0,
        le=1,
        description="Least time between two ingest transactions: envelopes arriving meanwhile "
        "are answered together by the next one (group commit). Adds at most this much to an "
        "answer; saves a transaction per envelope.",
    )
    commit_interval_busy_s: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="The least time between two ingest transactions while they are busy (the "
        "last one answered at least 8 envelopes): fewer, larger commits, and larger groups of "
        "envelopes applied together, at a cost of this much more time to an answer.",
    )
    fast_path: bool = Field(
        default=True,
        description="Serve POST /v2/ingest before FastAPI's routing and dependency injection "
        "(the same handler and rules; about half the CPU per envelope).",
    )
