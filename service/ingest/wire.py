"""The v1 wire vocabulary: identifiers, op spellings, comm kinds, and record value objects."""

from __future__ import annotations

import re
from dataclasses import dataclass

ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}$")

OPS = (
    "allreduce",
    "allgather",
    "reducescatter",
    "broadcast",
    "reduce",
    "alltoall",
    "barrier",
    "send",
    "recv",
)
P2P_OPS = frozenset({"send", "recv"})
COMM_KINDS = frozenset({"dp", "tp", "pp", "ep", "cp", "world", "p2p", "other"})

_PREFIXES = ("nccl", "c10d", "gloo")
_SUFFIXES = ("coalesced", "intotensor", "tensor", "single", "base", "v")
_ALIASES = {"isend": "send", "irecv": "recv", "sendrecv": "send", "all2all": "alltoall"}


def _normalise(raw: str) -> str | None:
    key = raw.strip().lower().replace("_", "").replace("-", "").replace(" ", "")
    for prefix in _PREFIXES:
        if key.startswith(prefix) and key != prefix:
            key = key[len(prefix) :]
    while True:
        if key in OPS:
            return key
        if key in _ALIASES:
            return _ALIASES[key]
        for suffix in _SUFFIXES:
            if key.endswith(suffix) and len(key) > len(suffix):
                key = key[: -len(suffix)]
                break
        else:
            return None


_OP_CACHE: dict[str, str | None] = {}


def normalise_op(raw: str) -> str | None:
    """Canonical op for NCCL/PyTorch spellings (``AllReduce``, ``_allgather_base``), else None."""
    try:
        return _OP_CACHE[raw]
    except KeyError:
        if len(_OP_CACHE) > 4096:  # bounded: spellings are few, garbage is not
            _OP_CACHE.clear()
        result = _OP_CACHE[raw] = _normalise(raw)
        return result


@dataclass(frozen=True, slots=True)
class CollectiveRecord:
    rank: int
    comm: str
    seq: int
    op: str
    nbytes: int
    start_ns: int
    end_ns: int | None
    peer: int | None


@dataclass(frozen=True, slots=True)
class StepRecord:
    rank: int
    step: int
    start_ns: int
    end_ns: int
