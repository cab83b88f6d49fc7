"""Compiled (numba) forms of the frame builder's two hot loops, used when numba is installed.

They compute exactly what the numpy code in :mod:`failslow.service.stream.frames` and
:func:`failslow.detectors.lateness.collective_stats` computes — the same formulas, element by
element — in one pass over each chunk of collectives, with no temporaries: at 100K ranks a step
brings about 3 million member records, and numpy's dozen passes over them (each allocating) cost
several times more than the arithmetic. Sums are accumulated in a different order than numpy's
``bincount`` (per element instead of per chunk), so results agree to rounding, not bit for bit.

``FAILSLOW_JIT=0`` turns them off (the numpy path is then used everywhere); the tests run both
paths and compare them.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

try:  # an optional accelerator: everything works without it
    import numba
except ImportError:  # pragma: no cover - exercised where numba is not installed
    numba = None

AVAILABLE = numba is not None
NS = 1e-9


def enabled() -> bool:
    return AVAILABLE and os.environ.get("FAILSLOW_JIT", "1") != "0"


def jit(fn: Any) -> Any:
    if numba is None:
        return fn
    try:  # compiled once per machine, then loaded from numba's cache
        return numba.njit(cache=True, nogil=True)(fn)
    except RuntimeError:  # no writable cache location (NUMBA_CACHE_DIR sets one)
        return numba.njit(nogil=True)(fn)


SMALL = 32  # rows up to this many members are ranked by comparisons; numpy sorts longer ones


@jit
def lateness_rows(starts, ends, dur, late, fastest):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN201
    """Per row (collective) of ``starts``/``ends`` (k, m) int64 ns, ``m <= SMALL``: each member's
    duration in seconds into ``dur``, its lateness (how far the median of the other members'
    durations exceeds its own, at least 0) into ``late``, and the row's shortest duration into
    ``fastest``. The leave-one-out median comes from the sorted row as in
    ``failslow.detectors.robust``; the row is sorted by counting, for each member, the members
    before it (no branches)."""
    k, m = starts.shape
    d = np.empty(m)
    s = np.empty(m)
    lo = (m - 2) // 2
    hi = (m - 1) // 2
    for i in range(k):
        if m == 2:  # a pair: the other's duration
            d0 = (ends[i, 0] - starts[i, 0]) * NS
            d1 = (ends[i, 1] - starts[i, 1]) * NS
            dur[i, 0] = d0
            dur[i, 1] = d1
            fastest[i] = d0 if d0 <= d1 else d1
            v = d1 - d0
            late[i, 0] = v if v > 0.0 else 0.0
            v = d0 - d1
            late[i, 1] = v if v > 0.0 else 0.0
            continue
        for j in range(m):
            d[j] = (ends[i, j] - starts[i, j]) * NS
        for j in range(m):
            x = d[j]
            r = 0
            for a in range(m):
                y = d[a]
                r += (y < x) | ((y == x) & (a < j))
            s[r] = x
        fastest[i] = s[0] if m else np.nan
        if m < 2:
            for j in range(m):
                dur[i, j] = d[j]
                late[i, j] = 0.0
            continue
        a0, a1, b0, b1 = s[lo], s[lo + 1], s[hi], s[hi + 1]
        for j in range(m):
            x = d[j]
            dur[i, j] = x
            o = a0 if x >= a1 else a1
            if lo != hi:
                o2 = b0 if x >= b1 else b1
                o = (o + o2) * 0.5
            v = o - x
            late[i, j] = v if v > 0.0 else 0.0


@jit
def place_rows(  # type: ignore[no-untyped-def]  # noqa: ANN201
    table,  # noqa: ANN001 - (comms of this size, m) member slots (Topology.member_slots)
    row_of,  # noqa: ANN001 - (n_comms,) row of each comm in ``table``
    starts,  # noqa: ANN001 - (k, m) member start_ns
    dur,  # noqa: ANN001 - (k, m) seconds
    late,  # noqa: ANN001 - (k, m) seconds
    kind,  # noqa: ANN001 - (k,) kind column
    comm,  # noqa: ANN001 - (k,) comm index
    fastest,  # noqa: ANN001 - (k,) transfer time
    ebytes,  # noqa: ANN001 - (k,) effective bytes
    f_start,  # noqa: ANN001 - (n,) this frame's step start per slot (-1: none)
    f_end,  # noqa: ANN001 - (n,) ... and end
    placed,  # noqa: ANN001 - (k, m) bool, in/out: already in an earlier frame
    out_busy,  # noqa: ANN001 - (n * nk,) summed durations per (slot, kind)
    out_late,  # noqa: ANN001 - (n * nk,) summed lateness per (slot, kind)
    out_calls,  # noqa: ANN001 - (n * nk,) counts per (slot, kind)
    c_transfer,  # noqa: ANN001 - (n_comms,)
    c_bytes,  # noqa: ANN001 - (n_comms,)
    c_calls,  # noqa: ANN001 - (n_comms,)
    nk,  # noqa: ANN001 - kinds
):
    """Adds every member record whose start lies in its own rank's step interval of this frame
    (and was not placed before) to the frame; a collective's transfer time and bytes go with
    its first member's record. Returns how many member records were placed."""
    k, m = starts.shape
    n = out_busy.size // nk
    n_c = c_calls.size
    count = 0
    for i in range(k):
        kd = kind[i]
        row = row_of[comm[i]]
        for j in range(m):
            if placed[i, j]:
                continue
            s = table[row, j]
            st = starts[i, j]
            if s < 0 or s >= n or st < f_start[s] or st >= f_end[s]:
                continue
            placed[i, j] = True
            count += 1
            out_busy[s * nk + kd] += dur[i, j]
            out_late[s * nk + kd] += late[i, j]
            out_calls[s * nk + kd] += 1.0
            if j == 0:
                c = comm[i]
                if 0 <= c < n_c:
                    c_transfer[c] += fastest[i]
                    c_bytes[c] += ebytes[i]
                    c_calls[c] += 1.0
    return count
