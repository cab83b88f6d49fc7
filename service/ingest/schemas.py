"""The v1 envelope's records as the OpenAPI document describes them, and the ingest response.

The handler does not parse bodies with these models: the envelope is checked by
:mod:`failslow.service.ingest.envelope` and each record on its own by the event-time core
(:mod:`failslow.service.stream.parse`), so that one bad record rejects only itself. They exist so
that ``/openapi.json`` describes the contract exactly; :func:`envelope_schema` composes the
envelope's schema from them (the one envelope type in code is
:class:`failslow.service.stream.records.Envelope`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, TypeAdapter

from failslow.detectors.vocab import CommKind
from failslow.service.ids import IDENTIFIER
from failslow.service.stream.parse import INT32_MAX  # what the INTEGER columns hold

Identifier = Field(pattern=IDENTIFIER)


class RankIn(BaseModel):
    rank: int = Field(ge=0, le=INT32_MAX, description="Global rank.")
    gpu: int | None = Field(default=None, ge=0, le=INT32_MAX, description="Local device index.")
    world_size: int | None = Field(default=None, ge=1, le=INT32_MAX)


class CommIn(BaseModel):
    comm: str = Identifier
    kind: CommKind
    ranks: list[int] = Field(description="Global ranks in ring order.")


class CollectiveIn(BaseModel):
    rank: int = Field(ge=0, le=INT32_MAX)
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
    rank: int = Field(ge=0, le=INT32_MAX)
    step: int = Field(ge=0, le=INT32_MAX)
    start_ns: int = Field(ge=0)
    end_ns: int = Field(ge=0)
    work: float | None = Field(
        default=None,
        gt=0,
        description="The step's work on this rank (tokens, samples: one unit for the whole "
        "job), where it varies (sequence lengths, MoE routing): compute is compared per unit of "
        "work. Absent: equal work.",
    )


class Rejection(BaseModel):
    index: str = Field(description='Location of the record, e.g. "collectives[3]".')
    reason: str


class IngestResult(BaseModel):
    accepted: int = Field(description="Records (collectives + steps) newly stored or completed.")
    duplicates: int = Field(description="Records identical to ones already stored.")
    rejected: list[Rejection]
    queued: bool | None = Field(
        default=None,
        description="Present (true) only when a bus is configured (docs/replicas.md): the "
        "stream holds the batch and the job's owning replica checks its records; `accepted` "
        "counts the records queued, and per-record rejections show in the host's counters "
        "instead of here.",
    )


def envelope_schema(ref_template: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(schema of the envelope, schemas of its parts)`` for the OpenAPI components."""
    parts: dict[str, Any] = {}
    refs: dict[str, dict[str, str]] = {}
    for model in (RankIn, CommIn, CollectiveIn, StepIn):
        schema = TypeAdapter(model).json_schema(ref_template=ref_template)
        parts.update(schema.pop("$defs", {}))
        parts[model.__name__] = schema
        refs[model.__name__] = {"$ref": ref_template.format(model=model.__name__)}

    def many(name: str) -> dict[str, Any]:
        return {"type": "array", "items": refs[name], "default": []}

    ident = {"type": "string", "pattern": IDENTIFIER}
    envelope = {
        "title": "Envelope",
        "description": "One host's records for one job. An envelope with no records is a "
        "heartbeat.",
        "type": "object",
        "required": ["job", "host", "sent_ns"],
        "properties": {
            "job": {**ident, "title": "Job"},
            "host": {**ident, "title": "Host"},
            "sent_ns": {
                "type": "integer",
                "minimum": 0,
                "title": "Sent Ns",
                "description": "Agent clock at send time; the job's event time follows its "
                "hosts' newest sent_ns.",
            },
            "agent": {
                "anyOf": [ident, {"type": "null"}],
                "default": None,
                "title": "Agent",
                "description": "(failslow addition) Agent stream id; with batch_seq, re-sends "
                "are no-ops.",
            },
            "batch_seq": {
                "anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}],
                "default": None,
                "title": "Batch Seq",
                "description": "(failslow addition) Increasing envelope number per agent.",
            },
            "complete_ns": {
                "anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}],
                "default": None,
                "title": "Complete Ns",
                "description": "(failslow addition) Every call and step of this envelope's "
                "ranks that ended at or before this time has been sent (here or earlier). With "
                "inflight_after_ns; at most sent_ns. Lets the service name a stopped rank "
                "sooner (docs/ingest-v1.md, Completeness).",
            },
            "inflight_after_ns": {
                "anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}],
                "default": None,
                "title": "Inflight After Ns",
                "description": "(failslow addition) Every call of this envelope's ranks begun "
                "this long before complete_ns and not ended by then has been sent as in flight "
                "(end_ns null). With complete_ns.",
            },
            "ranks": many("RankIn"),
            "comms": many("CommIn"),
            "collectives": many("CollectiveIn"),
            "steps": many("StepIn"),
        },
    }
    return envelope, parts
