"""A host's topology for ingest v2: its ranks and the communicators its records name, registered
once (``PUT /v2/jobs/{job}/topology/{host}``) and referred to by a digest in every envelope.

The digest is computed the same way on both sides from a canonical form (ranks sorted by rank,
comms in the host's order: a comm's position in the list is its code in the envelopes), so an
agent knows it without asking, and any change to either list makes a new digest.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

DIGEST_CHARS = 16


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
        "comms": [{"comm": c["comm"], "kind": c["kind"], "ranks": list(c["ranks"])} for c in comms],
    }


def digest(ranks: list[dict[str, Any]], comms: list[dict[str, Any]]) -> str:
    raw = orjson.dumps(canonical(ranks, comms), option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(raw).hexdigest()[:DIGEST_CHARS]
