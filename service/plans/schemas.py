"""Plans on the wire (spec section 3)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from failslow.service.stream.parse import INT32_MAX  # what the INTEGER columns hold


class PlanOut(BaseModel):
    job: str
    version: int = Field(description="Grows with every change; 0 = the initial plan.")
    microbatch_shares: list[int] | None = Field(
        description="Micro-batches per data-parallel rank (index = data-parallel rank), summing "
        "to the declared global batch; null = equal shares."
    )
    excluded_hosts: list[str]
    excluded_ranks: list[int]
    rank_order: dict[str, list[int]] = Field(
        description="Per re-ordered communicator: its new rank (ring) order."
    )
    restart_epoch: int = Field(description="Grows with every restart failslow ordered.")
    reason: str
    created_ns: int
    applied_step: int | None = Field(
        default=None, description="The step from which the job said it runs this version."
    )


class PlanVersionOut(PlanOut):
    action: str | None = Field(description="The action that published this version.")


class PlanAck(BaseModel):
    """Sent by the training job when it applies a plan version (at a step boundary)."""

    version: int = Field(ge=1, le=INT32_MAX)
    step: int = Field(ge=0, le=INT32_MAX, description="The first step run under this version.")


class WorkloadIn(BaseModel):
    global_batch: int = Field(
        ge=1, le=10_000_000, description="Micro-batches per step over all data-parallel ranks."
    )
    unit: Literal["microbatches", "samples"] = "microbatches"


class WorkloadOut(WorkloadIn):
    job: str
    updated_ns: int


def plan_out(
    job: str,
    version: int,
    body: dict[str, Any],
    created_ns: int,
    applied_step: int | None = None,
) -> PlanOut:
    return PlanOut(
        job=job,
        version=version,
        microbatch_shares=body.get("microbatch_shares"),
        excluded_hosts=list(body.get("excluded_hosts", [])),
        excluded_ranks=list(body.get("excluded_ranks", [])),
        rank_order={k: list(v) for k, v in body.get("rank_order", {}).items()},
        restart_epoch=int(body.get("restart_epoch", 0)),
        reason=str(body.get("reason", "")),
        created_ns=created_ns,
        applied_step=applied_step,
    )
