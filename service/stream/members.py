"""Member records of a job's collectives as columns (:data:`COLUMNS`), and the whole-array
operations the join (:mod:`.join`) does on them: sort keys by (comm, seq), taking, merging.
"""

from __future__ import annotations

import numpy as np

SEQ_BITS = 40
SEQ_MASK = (1 << SEQ_BITS) - 1  # the sort key holds a seq modulo 2^40 (pending collectives of
MAX_COMMS = 1 << 22  # one comm are never 2^40 apart) and the comm index above it
COLUMNS = ("comm", "seq", "pos", "slot", "op", "nbytes", "start", "end", "seen", "arrival")
DTYPES = {
    "comm": np.int64, "seq": np.int64, "pos": np.int64, "slot": np.int64, "op": np.uint8,
    "nbytes": np.int64, "start": np.int64, "end": np.int64, "seen": np.int64,
    "arrival": np.int64,
}  # fmt: skip


def empty_columns() -> dict[str, np.ndarray]:
    return {c: np.zeros(0, DTYPES[c]) for c in COLUMNS}


def take(cols: dict[str, np.ndarray], index: np.ndarray) -> dict[str, np.ndarray]:
    return {c: v[index] for c, v in cols.items()}


def count_keys(key: np.ndarray) -> int:
    """Distinct collectives among records sorted by key."""
    return int(key.size and 1 + np.count_nonzero(key[1:] != key[:-1]))


def sort_key(cols: dict[str, np.ndarray]) -> np.ndarray:
    """The (comm, seq) sort key of each record."""
    return (cols["comm"] << SEQ_BITS) | (cols["seq"] & SEQ_MASK)


def ranges(lo: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``concatenate([arange(a, a + n) for a, n in zip(lo, lengths)])``, without the loop."""
    total = int(lengths.sum())
    if not total:
        return np.zeros(0, np.int64)
    starts = np.cumsum(lengths) - lengths  # where each range begins in the output
    return np.arange(total, dtype=np.int64) + np.repeat(lo - starts, lengths)


def merge(
    a: dict[str, np.ndarray], akey: np.ndarray, b: dict[str, np.ndarray], bkey: np.ndarray
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Merge two column sets sorted by key whose keys are disjoint: (columns, keys), sorted."""
    if not bkey.size:
        return a, akey
    if not akey.size:
        return b, bkey
    at_b = np.searchsorted(akey, bkey, side="left") + np.arange(bkey.size)
    from_b = np.zeros(akey.size + bkey.size, dtype=bool)
    from_b[at_b] = True
    out = {}
    for c in COLUMNS:
        col = np.empty(from_b.size, DTYPES[c])
        col[from_b], col[~from_b] = b[c], a[c]
        out[c] = col
    key = np.empty(from_b.size, np.int64)
    key[from_b], key[~from_b] = bkey, akey
    return out, key
