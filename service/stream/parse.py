"""Validation of single records, each on its own (a bad record rejects only itself).

Context-free rules live here (types, ranges, op names); rules that depend on what the job
already holds (comm membership, conflicting re-sends, limits) live with that state.
"""

from __future__ import annotations

from typing import Any

from failslow.detectors.vocab import P2P_OPS, CommKind
from failslow.service.ids import is_identifier
from failslow.service.stream.records import (
    CollectiveRecord,
    CommAnnouncement,
    RankAnnouncement,
    RecordError,
    Reject,
    StepRecord,
)
from failslow.wire.ops import normalise_op
from failslow.wire.topology import BadMembers, members

INT64_MAX = 2**63 - 1
# Ranks, GPUs, world sizes and steps are stored in INTEGER columns (PostgreSQL: 32 bits): larger
# values are rejected per record here, never left to fail the commit (and block the job).
INT32_MAX = 2**31 - 1
_COMM_KINDS = {k.value: k for k in CommKind}


def is_int(value: Any) -> bool:
    return type(value) is int  # bool is not an int on the wire


def _req_int(
    rec: dict[str, Any], name: str, *, minimum: int = 0, maximum: int = INT64_MAX
) -> int:
    value = rec.get(name)
    if value is None:
        raise RecordError(Reject.INVALID, f"{name} is required")
    if not is_int(value):
        raise RecordError(Reject.INVALID, f"{name} must be an integer")
    if value < minimum:
        raise RecordError(Reject.INVALID, f"{name} must be >= {minimum}")
    if value > maximum:
        limit = "2^31" if maximum == INT32_MAX else "2^63"
        raise RecordError(Reject.INVALID, f"{name} must be < {limit}")
    return value


def _obj(rec: Any) -> dict[str, Any]:
    if not isinstance(rec, dict):
        raise RecordError(Reject.INVALID, "record must be an object")
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
            and 0 <= rank <= INT32_MAX
            and seq >= 0
            and nbytes >= 0
            and 0 <= start <= INT64_MAX
            and (end is None or (type(end) is int and start <= end <= INT64_MAX))
            and is_identifier(comm)
        ):
            op = normalise_op(op_raw)
            if op is not None and (
                (peer is None and op not in P2P_OPS)
                or (op in P2P_OPS and type(peer) is int and 0 <= peer <= INT32_MAX and peer != rank)
            ):
                return CollectiveRecord(rank, comm, seq, op, nbytes, start, end, peer)
    return _parse_collective_slow(raw)


def _parse_collective_slow(raw: Any) -> CollectiveRecord:
    rec = _obj(raw)
    rank = _req_int(rec, "rank", maximum=INT32_MAX)
    comm = rec.get("comm")
    if not is_identifier(comm):
        raise RecordError(Reject.INVALID, "comm must be an identifier")
    seq = _req_int(rec, "seq")
    op_raw = rec.get("op")
    if not isinstance(op_raw, str):
        raise RecordError(Reject.INVALID, "op is required")
    op = normalise_op(op_raw)
    if op is None:
        raise RecordError(Reject.UNKNOWN_OP, f"unknown op {op_raw[:64]!r}")
    nbytes = rec.get("bytes")
    if nbytes is None:
        raise RecordError(Reject.INVALID, "bytes is required")
    if not is_int(nbytes):
        raise RecordError(Reject.INVALID, "bytes must be an integer")
    if nbytes < 0:
        raise RecordError(Reject.NEGATIVE_BYTES, "negative bytes")
    start_ns = _req_int(rec, "start_ns")
    end_ns = rec.get("end_ns")
    if end_ns is not None:
        if not is_int(end_ns):
            raise RecordError(Reject.INVALID, "end_ns must be an integer or null")
        if end_ns < start_ns:
            raise RecordError(Reject.END_BEFORE_START, "end_ns before start_ns")
    peer = rec.get("peer")
    if op in P2P_OPS:
        if peer is None:
            raise RecordError(Reject.MISSING_PEER, f"{op} without peer")
        if not is_int(peer) or peer < 0 or peer > INT32_MAX:
            raise RecordError(Reject.BAD_PEER, "peer must be an integer in [0, 2^31)")
        if peer == rank:
            raise RecordError(Reject.BAD_PEER, "peer equals rank")
    elif peer is not None:
        raise RecordError(Reject.BAD_PEER, f"peer given for {op}")
    return CollectiveRecord(rank, comm, seq, op, nbytes, start_ns, end_ns, peer)


def parse_step(raw: Any) -> StepRecord:
    rec = _obj(raw)
    rank = _req_int(rec, "rank", maximum=INT32_MAX)
    step = _req_int(rec, "step", maximum=INT32_MAX)
    start_ns = _req_int(rec, "start_ns")
    end_ns = _req_int(rec, "end_ns")
    if end_ns < start_ns:
        raise RecordError(Reject.END_BEFORE_START, "end_ns before start_ns")
    work = rec.get("work")
    if work is None:
        return StepRecord(rank, step, start_ns, end_ns)
    if type(work) not in (int, float) or not 0 < work < float("inf"):
        raise RecordError(Reject.INVALID, "work must be a positive number")
    return StepRecord(rank, step, start_ns, end_ns, float(work))


def parse_rank(raw: Any) -> RankAnnouncement:
    rec = _obj(raw)
    rank = _req_int(rec, "rank", maximum=INT32_MAX)
    gpu = rec.get("gpu")
    if gpu is not None and (not is_int(gpu) or gpu < 0 or gpu > INT32_MAX):
        raise RecordError(Reject.INVALID, "gpu must be an integer in [0, 2^31)")
    world = rec.get("world_size")
    if world is not None:
        if not is_int(world) or world < 1 or world > INT32_MAX:
            raise RecordError(Reject.INVALID, "world_size must be an integer in [1, 2^31)")
        if rank >= world:
            raise RecordError(Reject.INVALID, "rank must be < world_size")
    return RankAnnouncement(rank, gpu, world)


def parse_comm(raw: Any) -> CommAnnouncement:
    rec = _obj(raw)
    comm = rec.get("comm")
    if not is_identifier(comm):
        raise RecordError(Reject.INVALID, "comm must be an identifier")
    kind_raw = rec.get("kind")
    kind = _COMM_KINDS.get(kind_raw) if isinstance(kind_raw, str) else None
    if kind is None:
        raise RecordError(Reject.INVALID, f"kind must be one of {sorted(_COMM_KINDS)}")
    try:  # a list, or a range {start, stop, step} (wire/topology.py)
        ranks = members(rec.get("ranks"))
    except BadMembers as exc:
        raise RecordError(Reject.INVALID, str(exc)) from None
    # a range ascends: its last member is its largest (max over 3,200 members per host adds up)
    top = ranks[-1] if isinstance(rec.get("ranks"), dict) else max(ranks, default=0)
    if top > INT32_MAX:
        raise RecordError(Reject.INVALID, "comm member ranks must be < 2^31")
    if kind == CommKind.P2P and len(ranks) != 2:
        raise RecordError(Reject.INVALID, "a p2p comm has exactly two ranks")
    return CommAnnouncement(comm, kind, ranks)
