"""Local SDK -> agent message format, and v1 envelope encoding.

Messages are JSON lines of compact arrays (one datagram or spool file holds many):
``["c", rank, comm, seq, op, bytes, start_ns, end_ns, peer]`` a collective record,
``["s", rank, step, start_ns, end_ns]`` a step (``[..., work]``: with its work, in tokens or
samples), ``["r", rank, gpu, world_size]`` a rank,
``["m", comm, kind, [ranks...]]`` a communicator. The first line is a header
``{"v": 1, "job": ..., "pid": ...}``.
"""

from __future__ import annotations

import gzip
from typing import Any

import orjson

VERSION = 1
MAX_DATAGRAM = 60_000


def header(job: str, pid: int) -> bytes:
    return orjson.dumps({"v": VERSION, "job": job, "pid": pid})


def encode_lines(items: list[list[Any]]) -> bytes:
    return b"\n".join(orjson.dumps(i) for i in items)


def sender_pid(head: dict[str, Any]) -> int | None:
    """The SDK process that sent a payload (its header's ``pid``; None: not said)."""
    pid = head.get("pid")
    return pid if isinstance(pid, int) else None


def decode_payload(payload: bytes) -> tuple[dict[str, Any], list[list[Any]]]:
    """Split a datagram or spool file into its header and messages; raise ValueError if bad."""
    lines = payload.split(b"\n")
    head = orjson.loads(lines[0])
    if not isinstance(head, dict) or head.get("v") != VERSION:
        raise ValueError("bad header")
    out: list[list[Any]] = []
    for line in lines[1:]:
        if line:
            item = orjson.loads(line)
            if isinstance(item, list) and item:
                out.append(item)
    return head, out


def collective_dict(m: list[Any]) -> dict[str, Any]:
    _, rank, comm, seq, op, nbytes, start, end, peer = m
    d = {
        "rank": rank,
        "comm": comm,
        "seq": seq,
        "op": op,
        "bytes": nbytes,
        "start_ns": start,
        "end_ns": end,
    }
    if peer is not None:
        d["peer"] = peer
    return d


def step_dict(m: list[Any]) -> dict[str, Any]:
    _, rank, step, start, end, *rest = m
    d = {"rank": rank, "step": step, "start_ns": start, "end_ns": end}
    if rest and rest[0] is not None:
        d["work"] = rest[0]
    return d


def encode_envelope(envelope: dict[str, Any], *, compress: bool = True) -> bytes:
    raw = orjson.dumps(envelope)
    return gzip.compress(raw, compresslevel=3) if compress else raw
