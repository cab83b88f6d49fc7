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
    retry_after_s: int = Field(default=1, ge=1, description="Retry-After sent with a 429.")
