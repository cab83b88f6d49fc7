"""Pydantic descriptions of the v1 envelope for the OpenAPI document, and the ingest response.

The handler does not parse bodies with these models: per-record validation must reject one
record at a time (see :mod:`failslow.service.ingest.validate`). They exist so that ``/openapi.json``
describes the contract exactly.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

Identifier = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}$")


class RankIn(BaseModel):
    rank: int = Field(ge=0, description="Global rank.")
    gpu: int | None = Field(default=None, ge=0, description="Local device index.")
    world_size: int | None = Field(default=None, ge=1)


class CommIn(BaseModel):
    comm: str = Identifier
    kind: Literal["dp", "tp", "pp", "ep", "cp", "world", "p2p", "other"]
    ranks: list[int] = Field(description="Global ranks in ring order.")


class CollectiveIn(BaseModel):
    rank: int = Field(ge=0)
    comm: str = Identifier
    seq: int = Field(ge=0, description="Per-communicator sequence number, equal on every member.")
    op: str = Field(
        description="allreduce, allgather, reducescatter, broadcast, reduce, alltoall, "
        "barrier, send, recv (NCCL/PyTorch spellings are normalised)."
    )
    bytes: int = Field(ge=0)
    start_ns: int = Field(ge=0)
    end_ns: int | None = Field(description="null while the call is still in flight.")
    peer: int | None = Field(default=None, description="Other side; required for send/recv only.")


class StepIn(BaseModel):
    rank: int = Field(ge=0)
    step: int = Field(ge=0)
    start_ns: int = Field(ge=0)
    end_ns: int = Field(ge=0)


class Envelope(BaseModel):
    """One host's records for one job. An envelope with no records is a heartbeat."""

    job: str = Identifier
    host: str = Identifier
    sent_ns: int = Field(ge=0, description="Agent clock at send time; the newest is the job's now.")
    agent: str | None = Field(
        default=None,
        description="(failslow addition) Agent stream id; with batch_seq, re-sends are no-ops.",
    )
    batch_seq: int | None = Field(
        default=None, ge=0, description="(failslow addition) Increasing envelope number per agent."
    )
    ranks: list[RankIn] = Field(default_factory=list)
    comms: list[CommIn] = Field(default_factory=list)
    collectives: list[CollectiveIn] = Field(default_factory=list)
    steps: list[StepIn] = Field(default_factory=list)


class Rejection(BaseModel):
    index: str = Field(description='Location of the record, e.g. "collectives[3]".')
    reason: str


class IngestResult(BaseModel):
    accepted: int = Field(description="Records (collectives + steps) newly stored or completed.")
    duplicates: int = Field(description="Records identical to ones already stored.")
    rejected: list[Rejection]
