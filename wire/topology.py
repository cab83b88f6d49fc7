"""A host's topology for ingest v2: its ranks and the communicators its records name, registered
once (``PUT /v2/jobs/{job}/topology/{host}``) and referred to by a digest in every envelope.

The digest is computed the same way on both sides from a canonical form (ranks sorted by rank,
comms in the host's order: a comm's position in the list is its code in the envelopes), so an
agent knows it without asking, and any change to either list makes a new digest.

A comm's members may be written as a range, ``{"start": a, "stop": b, "step": s}`` (Python's
``range``), and the canonical form writes every arithmetic progression of at least
:data:`RANGE_MIN` members so: a data-parallel group of a 100K-rank job (3,200 members, every
32nd rank) is three numbers instead of 3,200 in each of its 400 hosts' registrations — without
it, registering a job costs the square of its size.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

DIGEST_CHARS = 16


RANGE_MIN = 4  # progressions this long or longer are written as ranges
MAX_MEMBERS = 1 << 20
MAX_RANK = 2**31 - 1  # ranks are int32 everywhere in the contract (records, columns)


class BadMembers(ValueError):
    """A comm's member list (or range) breaks a rule."""


def members(spec: Any) -> tuple[int, ...]:
    """A comm's member ranks from its list or range form; raises :class:`BadMembers`."""
    if isinstance(spec, dict):
        start, stop, step = spec.get("start"), spec.get("stop"), spec.get("step", 1)
        if not all(type(v) is int for v in (start, stop, step)) or set(spec) - {
            "start", "stop", "step"}:  # fmt: skip
            raise BadMembers("a range of ranks is {start, stop, step} with integers")
        if start < 0 or step < 1:
            raise BadMembers("a range of ranks needs start >= 0 and step >= 1")
        if start > MAX_RANK or stop > MAX_RANK + 1:  # len(range) overflows past 2^63
            raise BadMembers(f"ranks must be at most {MAX_RANK}")
        r = range(start, stop, step)
        if not 0 < len(r) <= MAX_MEMBERS:
            raise BadMembers(f"a range of ranks must have 1 to {MAX_MEMBERS} members")
        return tuple(r)
    if not isinstance(spec, list) or not spec:
        raise BadMembers("ranks must be a non-empty list or a range")
    if len(spec) > MAX_MEMBERS:
        raise BadMembers(f"a comm has at most {MAX_MEMBERS} members")
    if not all(type(r) is int and 0 <= r <= MAX_RANK for r in spec):
        raise BadMembers(f"ranks must be integers from 0 to {MAX_RANK}")
    if len(set(spec)) != len(spec):
        raise BadMembers("ranks must be distinct")
    return tuple(spec)


def compact(spec: Any) -> list[int] | dict[str, int]:
    """The canonical form of a member list: a range when it is a progression of at least
    :data:`RANGE_MIN` members (written ``stop = last + 1``), else the list."""
    if isinstance(spec, dict):
        r = range(spec["start"], spec["stop"], spec.get("step", 1))
        if len(r) < RANGE_MIN:
            return list(r)
        return {"start": r.start, "stop": r[-1] + 1, "step": r.step}
    ranks = list(spec)
    if len(ranks) >= RANGE_MIN:
        step = ranks[1] - ranks[0]
        if step > 0 and ranks == list(range(ranks[0], ranks[-1] + 1, step)):
            return {"start": ranks[0], "stop": ranks[-1] + 1, "step": step}
    return ranks


def canonical(ranks: list[dict[str, Any]], comms: list[dict[str, Any]]) -> dict[str, Any]:
    """The form the digest is taken of: ranks sorted, only the fields of the contract."""
    return {
        "ranks": sorted(
            (
                {"rank": r["rank"], "gpu": r.get("gpu"), "world_size": r.get("world_size")}
                for r in ranks
            ),
            key=lambda r: r["rank"],
        ),
        "comms": [
            {"comm": c["comm"], "kind": c["kind"], "ranks": compact(c["ranks"])} for c in comms
        ],
    }


def canonical_bytes(ranks: list[dict[str, Any]], comms: list[dict[str, Any]]) -> bytes:
    """The canonical form as the bytes the digest is taken of (also what a service stores)."""
    return orjson.dumps(canonical(ranks, comms), option=orjson.OPT_SORT_KEYS)


def digest_of(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()[:DIGEST_CHARS]


def digest(ranks: list[dict[str, Any]], comms: list[dict[str, Any]]) -> str:
    return digest_of(canonical_bytes(ranks, comms))
