"""Op names: the canonical ones and the NCCL / PyTorch spellings that mean them."""

from __future__ import annotations

from failslow.detectors.vocab import Op

_PREFIXES = ("nccl", "c10d", "gloo")
_SUFFIXES = ("coalesced", "intotensor", "tensor", "single", "base", "v")
_ALIASES = {"isend": Op.SEND, "irecv": Op.RECV, "sendrecv": Op.SEND, "all2all": Op.ALLTOALL}
_OPS = {op.value: op for op in Op}


def _normalise(raw: str) -> Op | None:
    key = raw.strip().lower().replace("_", "").replace("-", "").replace(" ", "")
    for prefix in _PREFIXES:
        if key.startswith(prefix) and key != prefix:
            key = key[len(prefix) :]
    while True:
        if key in _OPS:
            return _OPS[key]
        if key in _ALIASES:
            return _ALIASES[key]
        for suffix in _SUFFIXES:
            if key.endswith(suffix) and len(key) > len(suffix):
                key = key[: -len(suffix)]
                break
        else:
            return None


_OP_CACHE: dict[str, Op | None] = {}


def normalise_op(raw: str) -> Op | None:
    """Canonical op for NCCL/PyTorch spellings (``AllReduce``, ``_allgather_base``), else None."""
    try:
        return _OP_CACHE[raw]
    except KeyError:
        if len(_OP_CACHE) > 4096:  # bounded: spellings are few, garbage is not
            _OP_CACHE.clear()
        result = _OP_CACHE[raw] = _normalise(raw)
        return result
