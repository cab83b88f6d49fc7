"""Validation of v1 envelopes: whole-envelope rules (reject all) and per-record rules (reject one).

Per-record checks here are the context-free ones (types, ranges, op names). Rules that depend
on what the service already knows (comm membership, conflicting re-sends) live in the job state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from failslow.service.errors import InvalidEnvelope
from failslow.service.ingest.wire import (
    COMM_KINDS,
    ID_RE,
    P2P_OPS,
    CollectiveRecord,
    StepRecord,
    normalise_op,
)

INT64_MAX = 2**63 - 1
LIST_FIELDS = ("ranks", "comms", "collectives", "steps")


class RecordError(ValueError):
    """One record breaks a rule; the message is the reason reported to the client."""


@dataclass(slots=True)
class Envelope:
    """A structurally valid envelope whose records are still raw."""

    job: str
    host: str
    sent_ns: int
    agent: str | None
    batch_seq: int | None
    ranks: list[Any] = field(default_factory=list)
    comms: list[Any] = field(default_factory=list)
    collectives: list[Any] = field(default_factory=list)
    steps: list[Any] = field(default_factory=list)

    @property
    def record_count(self) -> int:
        return len(self.collectives) + len(self.steps)


def _is_int(value: Any) -> bool:
    return type(value) is int  # bool is not an int on the wire


def _ident(body: dict[str, Any], name: str, errors: list[dict[str, str]]) -> str:
    value = body.get(name)
    if value is None:
        errors.append({"loc": name, "msg": "field required"})
    elif not isinstance(value, str) or not ID_RE.match(value):
        errors.append({"loc": name, "msg": "must match ^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}$"})
    return value if isinstance(value, str) else ""


def parse_envelope(body: Any) -> Envelope:
    """Check the top level; raise :class:`InvalidEnvelope` listing every problem found."""
    if not isinstance(body, dict):
        raise InvalidEnvelope(
            "the body must be a JSON object", errors=[{"loc": "", "msg": "not an object"}]
        )
    errors: list[dict[str, str]] = []
    job = _ident(body, "job", errors)
    host = _ident(body, "host", errors)
    sent_ns = body.get("sent_ns")
    if sent_ns is None:
        errors.append({"loc": "sent_ns", "msg": "field required"})
    elif not _is_int(sent_ns) or not 0 <= sent_ns <= INT64_MAX:
        errors.append({"loc": "sent_ns", "msg": "must be a non-negative integer (ns since epoch)"})
    agent = body.get("agent")
    if agent is not None and (not isinstance(agent, str) or not ID_RE.match(agent)):
        errors.append({"loc": "agent", "msg": "must be an identifier"})
    batch_seq = body.get("batch_seq")
    if batch_seq is not None and (not _is_int(batch_seq) or batch_seq < 0):
        errors.append({"loc": "batch_seq", "msg": "must be a non-negative integer"})
    if (batch_seq is None) != (agent is None):
        errors.append({"loc": "batch_seq", "msg": "agent and batch_seq go together"})
    lists: dict[str, list[Any]] = {}
    for name in LIST_FIELDS:
        value = body.get(name)
        if value is None:
            lists[name] = []
        elif isinstance(value, list):
            lists[name] = value
        else:
            errors.append({"loc": name, "msg": "must be a list"})
    if errors:
        raise InvalidEnvelope("the envelope is not valid; nothing was stored", errors=errors)
    return Envelope(job, host, sent_ns, agent, batch_seq, **lists)  # type: ignore[arg-type]


def _req_int(rec: dict[str, Any], name: str, *, minimum: int = 0) -> int:
    value = rec.get(name)
    if value is None:
        raise RecordError(f"{name} is required")
    if not _is_int(value):
        raise RecordError(f"{name} must be an integer")
    if value < minimum or value > INT64_MAX:
        raise RecordError(f"{name} must be >= {minimum}")
    return value


def _obj(rec: Any) -> dict[str, Any]:
    if not isinstance(rec, dict):
        raise RecordError("record must be an object")
    return rec


def parse_collective(raw: Any) -> CollectiveRecord:
    """Validate one collective record (fast path for well-formed ones, precise errors otherwise)."""
    if type(raw) is dict:
        rank, comm, seq = raw.get("rank"), raw.get("comm"), raw.get("seq")
        op_raw, nbytes, start = raw.get("op"), raw.get("bytes"), raw.get("start_ns")
        end, peer = raw.get("end_ns"), raw.get("peer")
        if (
            type(rank) is int
            and type(seq) is int
            and type(nbytes) is int
            and type(start) is int
            and type(comm) is str
            and type(op_raw) is str
            and rank >= 0
            and seq >= 0
            and nbytes >= 0
            and 0 <= start <= INT64_MAX
            and (end is None or (type(end) is int and start <= end <= INT64_MAX))
            and ID_RE.match(comm)
        ):
            op = normalise_op(op_raw)
            if op is not None and (
                (peer is None and op not in P2P_OPS)
                or (op in P2P_OPS and type(peer) is int and 0 <= peer != rank)
            ):
                return CollectiveRecord(rank, comm, seq, op, nbytes, start, end, peer)
    return _parse_collective_slow(raw)


def _parse_collective_slow(raw: Any) -> CollectiveRecord:
    rec = _obj(raw)
    rank = _req_int(rec, "rank")
    comm = rec.get("comm")
    if not isinstance(comm, str) or not ID_RE.match(comm):
        raise RecordError("comm must be an identifier")
    seq = _req_int(rec, "seq")
    op_raw = rec.get("op")
    if not isinstance(op_raw, str):
        raise RecordError("op is required")
    op = normalise_op(op_raw)
    if op is None:
        raise RecordError(f"unknown op {op_raw[:64]!r}")
    nbytes = rec.get("bytes")
    if nbytes is None:
        raise RecordError("bytes is required")
    if not _is_int(nbytes):
        raise RecordError("bytes must be an integer")
    if nbytes < 0:
        raise RecordError("negative bytes")
    start_ns = _req_int(rec, "start_ns")
    end_ns = rec.get("end_ns")
    if end_ns is not None:
        if not _is_int(end_ns):
            raise RecordError("end_ns must be an integer or null")
        if end_ns < start_ns:
            raise RecordError("end_ns before start_ns")
    peer = rec.get("peer")
    if op in P2P_OPS:
        if peer is None:
            raise RecordError(f"{op} without peer")
        if not _is_int(peer) or peer < 0:
            raise RecordError("peer must be a non-negative integer")
        if peer == rank:
            raise RecordError("peer equals rank")
    elif peer is not None:
        raise RecordError(f"peer given for {op}")
    return CollectiveRecord(rank, comm, seq, op, nbytes, start_ns, end_ns, peer)


def parse_step(raw: Any) -> StepRecord:
    rec = _obj(raw)
    rank = _req_int(rec, "rank")
    step = _req_int(rec, "step")
    start_ns = _req_int(rec, "start_ns")
    end_ns = _req_int(rec, "end_ns")
    if end_ns < start_ns:
        raise RecordError("end_ns before start_ns")
    return StepRecord(rank, step, start_ns, end_ns)


@dataclass(frozen=True, slots=True)
class RankAnnouncement:
    rank: int
    gpu: int | None
    world_size: int | None


def parse_rank(raw: Any) -> RankAnnouncement:
    rec = _obj(raw)
    rank = _req_int(rec, "rank")
    gpu = rec.get("gpu")
    if gpu is not None and (not _is_int(gpu) or gpu < 0):
        raise RecordError("gpu must be a non-negative integer")
    world = rec.get("world_size")
    if world is not None:
        if not _is_int(world) or world < 1:
            raise RecordError("world_size must be a positive integer")
        if rank >= world:
            raise RecordError("rank must be < world_size")
    return RankAnnouncement(rank, gpu, world)


@dataclass(frozen=True, slots=True)
class CommAnnouncement:
    comm: str
    kind: str
    ranks: tuple[int, ...]


def parse_comm(raw: Any) -> CommAnnouncement:
    rec = _obj(raw)
    comm = rec.get("comm")
    if not isinstance(comm, str) or not ID_RE.match(comm):
        raise RecordError("comm must be an identifier")
    kind = rec.get("kind")
    if kind not in COMM_KINDS:
        raise RecordError(f"kind must be one of {sorted(COMM_KINDS)}")
    ranks = rec.get("ranks")
    if not isinstance(ranks, list) or not ranks:
        raise RecordError("ranks must be a non-empty list")
    if not all(_is_int(r) and r >= 0 for r in ranks):
        raise RecordError("ranks must be non-negative integers")
    if len(set(ranks)) != len(ranks):
        raise RecordError("ranks must be distinct")
    if kind == "p2p" and len(ranks) != 2:
        raise RecordError("a p2p comm has exactly two ranks")
    return CommAnnouncement(comm, kind, tuple(ranks))
