"""The per-record rules of a v2 envelope's collectives, as one reason code per record.

Two forms compute the same codes: :func:`reasons_numpy` (a dozen whole-array operations) and,
when numba is installed, a compiled single pass (:func:`reasons_compiled`). An envelope holds a
few hundred records, so numpy's fixed cost per operation, not the arithmetic, is what numpy pays
here; the compiled pass costs a few microseconds for the whole envelope. The job's frame builder
decides which (its ``jit``: ``FAILSLOW_JIT=0`` selects numpy); the tests compare both on random
envelopes.

Codes: 0 valid, else 1 + the index of the first rule broken in :data:`RULES` order (for step
records, :data:`STEP_RULES`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from failslow.detectors.vocab import Op
from failslow.service.stream import kernels
from failslow.service.stream.parse import INT32_MAX
from failslow.service.stream.records import Reject
from failslow.wire.v2 import NO_END, NO_PEER, OPS

RULES: tuple[tuple[Reject, str], ...] = (
    (Reject.INVALID, "rank is not one of the host's registered ranks"),
    (Reject.UNKNOWN_COMM, "comm code is not in the host's registered topology"),
    (Reject.WRONG_HOST, "rank now lives on another host"),
    (Reject.NOT_MEMBER, "rank is not a member of the comm"),
    (Reject.INVALID, "seq must be >= 0"),
    (Reject.UNKNOWN_OP, "unknown op code"),
    (Reject.NEGATIVE_BYTES, "negative bytes"),
    (Reject.INVALID, "start_ns must be >= 0"),
    (Reject.END_BEFORE_START, "end_ns before start_ns"),
    (Reject.BAD_PEER, "peer is not the other member of the comm (send/recv) or not -1"),
)
STEP_RULES: tuple[tuple[Reject, str], ...] = (
    (Reject.INVALID, "rank is not one of the host's registered ranks"),
    (Reject.WRONG_HOST, "rank now lives on another host"),
    (Reject.INVALID, "step must be >= 0 and < 2^31"),
    (Reject.INVALID, "start_ns must be >= 0"),
    (Reject.END_BEFORE_START, "end_ns before start_ns"),
    (Reject.INVALID, "work must be a positive number"),  # checked in columnar.check_columns
)
P2P_CODE = np.array([op in (Op.SEND, Op.RECV) for op in OPS])
N_OPS = len(OPS)


def reasons_numpy(
    c: dict[str, np.ndarray],
    ranks: np.ndarray,
    slots: np.ndarray,
    position: np.ndarray,
    other: np.ndarray,
    slot_host: np.ndarray,
    host_index: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(reason, column, slot, pos)`` per record of the collective columns ``c``, checked
    against the host's sorted global ``ranks`` (their ``slots``), the ``position`` and ``other``
    tables (comm code x rank column) and the job's ``slot_host``."""
    rank, code = c["rank"].astype(np.int64), c["comm"].astype(np.int64)
    n = rank.size
    j, own, slot, here = _own(rank, ranks, slots, slot_host, host_index)
    known = code < position.shape[0]
    code_ok = np.where(known, code, 0)
    empty = not position.size
    pos = np.full(n, -1, np.int64) if empty else position[code_ok, j]
    op = c["op"]
    op_ok = op < N_OPS
    p2p = P2P_CODE[np.where(op_ok, op, 0)]
    peer = c["peer"].astype(np.int64)
    oth = np.full(n, NO_PEER, np.int64) if empty else other[code_ok, j]
    start, end = c["start_ns"], c["end_ns"]
    failed = (
        ~own,
        ~known,
        ~here,
        pos < 0,
        c["seq"] < 0,
        ~op_ok,
        c["bytes"] < 0,
        start < 0,
        (end != NO_END) & (end < start),
        np.where(p2p, (oth == NO_PEER) | (peer != oth), peer != NO_PEER),
    )
    reason = np.zeros(n, np.uint8)
    for k in range(len(failed) - 1, -1, -1):  # the first rule broken wins
        reason[failed[k]] = k + 1
    return reason, code_ok, slot, pos


def _reasons_loop(rank, code, seq, op, nbytes, start, end, peer, bounds, ranks, rank_off, slots,
                  position, other, tab_off, comm_index, code_off, host_index, p2p, slot_host,
                  reason, comm_out, slot_out, pos_out):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202, E501, PLR0913
    """The compiled pass: the same rules as :func:`reasons_numpy`, record by record, over the
    records of several envelopes end to end. Envelope ``e`` holds records
    ``bounds[e]:bounds[e + 1]``; its host's ranks and slots are ``ranks[rank_off[e]:rank_off[e +
    1]]``, its (codes x ranks) tables start at ``tab_off[e]`` of the flat ``position`` and
    ``other``, its code -> job comm index table at ``code_off[e]`` of ``comm_index`` (as many
    codes as the tables have rows). ``comm_out``: the job's comm index."""
    n_hosts = slot_host.shape[0]
    for e in range(bounds.shape[0] - 1):
        r0 = rank_off[e]
        n_ranks = rank_off[e + 1] - r0
        n_codes = code_off[e + 1] - code_off[e]
        t0 = tab_off[e]
        c0 = code_off[e]
        hix = host_index[e]
        for i in range(bounds[e], bounds[e + 1]):
            r = rank[i]
            lo, hi = 0, n_ranks
            while lo < hi:  # the host's few ranks, sorted
                mid = (lo + hi) // 2
                if ranks[r0 + mid] < r:
                    lo = mid + 1
                else:
                    hi = mid
            j = min(lo, n_ranks - 1) if n_ranks else 0
            own = n_ranks > 0 and ranks[r0 + j] == r
            cd = code[i]
            known = cd < n_codes
            c = cd if known else 0
            s = slots[r0 + j] if n_ranks else 0
            here = own
            if own and n_hosts:
                here = slot_host[min(s, n_hosts - 1)] == hix
            cell = t0 + c * n_ranks + j
            pos = position[cell] if (n_codes and n_ranks) else -1
            o = op[i]
            oth = other[cell] if (n_codes and n_ranks) else -1
            comm_out[i] = comm_index[c0 + c] if n_codes else c
            slot_out[i] = s
            pos_out[i] = pos
            if not own:
                reason[i] = 1
            elif not known:
                reason[i] = 2
            elif not here:
                reason[i] = 3
            elif pos < 0:
                reason[i] = 4
            elif seq[i] < 0:
                reason[i] = 5
            elif o >= p2p.shape[0]:
                reason[i] = 6
            elif nbytes[i] < 0:
                reason[i] = 7
            elif start[i] < 0:
                reason[i] = 8
            elif end[i] != -1 and end[i] < start[i]:
                reason[i] = 9
            elif (p2p[o] and (oth == -1 or peer[i] != oth)) or (not p2p[o] and peer[i] != -1):
                reason[i] = 10
            else:
                reason[i] = 0


_compiled_loop: Any = kernels.jit(_reasons_loop) if kernels.AVAILABLE else None


@dataclass(frozen=True, slots=True)
class HostTables:
    """The lookup tables of one host's registration (``columnar.HostTopology`` holds them)."""

    ranks: np.ndarray  # (r,) the host's global ranks, sorted
    slots: np.ndarray  # (r,) their slots in the job
    comm_index: np.ndarray  # (c,) host comm code -> the job's comm index
    position: np.ndarray  # (c, r) member position of each host rank in each comm, -1: none
    other: np.ndarray  # (c, r) for two-member comms: the other member's global rank, else -1


def _offsets(sizes: list[int]) -> np.ndarray:
    out = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, out=out[1:])
    return out


def _flat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if len(parts) > 1 else parts[0].reshape(-1)


def reasons_group(
    c: dict[str, np.ndarray],
    counts: list[int],
    tables: list[HostTables],
    host_index: list[int],
    slot_host: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`reasons_numpy` for the records of several envelopes end to end in one compiled
    pass (numba must be installed): envelope ``e`` holds ``counts[e]`` records, checked against
    ``tables[e]`` for host ``host_index[e]``. ``(reason, job comm index, slot, pos)``."""
    n = c["rank"].size
    reason = np.empty(n, np.uint8)
    comm, slot, pos = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
    if not n:
        return reason, comm, slot, pos
    _compiled_loop(
        c["rank"], c["comm"], c["seq"], c["op"], c["bytes"], c["start_ns"], c["end_ns"],
        c["peer"], _offsets(counts),
        _flat([t.ranks for t in tables]), _offsets([t.ranks.size for t in tables]),
        _flat([t.slots for t in tables]),
        _flat([t.position.reshape(-1) for t in tables]),
        _flat([t.other.reshape(-1) for t in tables]),
        _offsets([t.position.size for t in tables])[:-1],
        _flat([t.comm_index for t in tables]), _offsets([t.comm_index.size for t in tables]),
        np.asarray(host_index, np.int64), P2P_CODE, slot_host, reason, comm, slot, pos,
    )  # fmt: skip
    return reason, comm, slot, pos


def reasons_compiled(
    c: dict[str, np.ndarray],
    ranks: np.ndarray,
    slots: np.ndarray,
    position: np.ndarray,
    other: np.ndarray,
    slot_host: np.ndarray,
    host_index: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`reasons_numpy` in one compiled pass (numba must be installed); the host's comm
    code comes back as the column, as there."""
    codes = np.arange(position.shape[0], dtype=np.int64)
    t = HostTables(ranks, slots, codes, position, other)
    return reasons_group(c, [int(c["rank"].size)], [t], [host_index], slot_host)


def _bounds(counts: list[int]) -> list[tuple[int, int]]:
    o = _offsets(counts).tolist()
    return list(zip(o[:-1], o[1:], strict=True))


def reasons(
    c: dict[str, np.ndarray],
    counts: list[int],
    tables: list[HostTables],
    host_index: list[int],
    slot_host: np.ndarray,
    *,
    jit: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`reasons_group` when ``jit`` (and numba is installed), else numpy envelope by
    envelope (the same answers)."""
    if jit and kernels.AVAILABLE:
        return reasons_group(c, counts, tables, host_index, slot_host)
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    for (lo, hi), t, h in zip(_bounds(counts), tables, host_index, strict=True):
        mine = {k: v[lo:hi] for k, v in c.items()}
        reason, code, slot, pos = reasons_numpy(
            mine, t.ranks, t.slots, t.position, t.other, slot_host, h
        )
        parts.append((reason, t.comm_index[code] if t.comm_index.size else code, slot, pos))
    if len(parts) == 1:
        return parts[0]
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(4))  # type: ignore[return-value]


def step_reasons(
    s: dict[str, np.ndarray],
    counts: list[int],
    tables: list[HostTables],
    host_index: list[int],
    slot_host: np.ndarray,
    *,
    jit: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`step_reasons_group` when ``jit`` (and numba is installed), else numpy."""
    if jit and kernels.AVAILABLE:
        return step_reasons_group(s, counts, tables, host_index, slot_host)
    parts = [
        step_reasons_numpy({k: v[lo:hi] for k, v in s.items()}, t.ranks, t.slots, slot_host, h)
        for (lo, hi), t, h in zip(_bounds(counts), tables, host_index, strict=True)
    ]
    if len(parts) == 1:
        return parts[0]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def _own(
    rank: np.ndarray, ranks: np.ndarray, slots: np.ndarray, slot_host: np.ndarray, host_index: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(column, own, slot, here)``: each rank's column in the host's tables, whether the host
    registered it, its slot, and whether the job still places it on this host."""
    n = rank.size
    if not ranks.size:
        return np.zeros(n, np.int64), np.zeros(n, bool), np.zeros(n, np.int64), np.zeros(n, bool)
    j = np.minimum(np.searchsorted(ranks, rank), ranks.size - 1)
    own = ranks[j] == rank
    slot = slots[j]
    if not slot_host.size:
        return j, own, slot, own
    return j, own, slot, own & (slot_host[np.minimum(slot, slot_host.size - 1)] == host_index)


def step_reasons_numpy(
    s: dict[str, np.ndarray],
    ranks: np.ndarray,
    slots: np.ndarray,
    slot_host: np.ndarray,
    host_index: int,
) -> tuple[np.ndarray, np.ndarray]:
    """``(reason, slot)`` per step record of the step columns ``s`` (see :data:`STEP_RULES`)."""
    _, own, slot, here = _own(s["rank"].astype(np.int64), ranks, slots, slot_host, host_index)
    bad_step = (s["step"] < 0) | (s["step"] > INT32_MAX)
    failed = (~own, ~here, bad_step, s["start_ns"] < 0, s["end_ns"] < s["start_ns"])
    reason = np.zeros(own.size, np.uint8)
    for k in range(len(failed) - 1, -1, -1):
        reason[failed[k]] = k + 1
    return reason, slot


def _step_loop(rank, step, start, end, bounds, ranks, rank_off, slots, slot_host, host_index,
               reason, slot_out):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202, E501, PLR0913
    """:func:`step_reasons_numpy`, record by record, over several envelopes end to end (the
    offsets as in :func:`_reasons_loop`)."""
    n_hosts = slot_host.shape[0]
    for e in range(bounds.shape[0] - 1):
        r0 = rank_off[e]
        n_ranks = rank_off[e + 1] - r0
        hix = host_index[e]
        for i in range(bounds[e], bounds[e + 1]):
            r = rank[i]
            lo, hi = 0, n_ranks
            while lo < hi:
                mid = (lo + hi) // 2
                if ranks[r0 + mid] < r:
                    lo = mid + 1
                else:
                    hi = mid
            j = min(lo, n_ranks - 1) if n_ranks else 0
            own = n_ranks > 0 and ranks[r0 + j] == r
            sl = slots[r0 + j] if n_ranks else 0
            here = own
            if own and n_hosts:
                here = slot_host[min(sl, n_hosts - 1)] == hix
            slot_out[i] = sl
            if not own:
                reason[i] = 1
            elif not here:
                reason[i] = 2
            elif step[i] < 0 or step[i] > 2147483647:  # INT32_MAX (a literal for numba)
                reason[i] = 3
            elif start[i] < 0:
                reason[i] = 4
            elif end[i] < start[i]:
                reason[i] = 5
            else:
                reason[i] = 0


_compiled_steps: Any = kernels.jit(_step_loop) if kernels.AVAILABLE else None


def step_reasons_group(
    s: dict[str, np.ndarray],
    counts: list[int],
    tables: list[HostTables],
    host_index: list[int],
    slot_host: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`step_reasons_numpy` over several envelopes in one compiled pass (see
    :func:`reasons_group`)."""
    n = s["rank"].size
    reason, slot = np.empty(n, np.uint8), np.empty(n, np.int64)
    if n:
        _compiled_steps(
            s["rank"], s["step"], s["start_ns"], s["end_ns"], _offsets(counts),
            _flat([t.ranks for t in tables]), _offsets([t.ranks.size for t in tables]),
            _flat([t.slots for t in tables]), slot_host, np.asarray(host_index, np.int64),
            reason, slot,
        )  # fmt: skip
    return reason, slot


def step_reasons_compiled(
    s: dict[str, np.ndarray],
    ranks: np.ndarray,
    slots: np.ndarray,
    slot_host: np.ndarray,
    host_index: int,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`step_reasons_numpy` in one compiled pass (numba must be installed)."""
    none = np.zeros((0, ranks.size), np.int64)
    t = HostTables(ranks, slots, np.zeros(0, np.int64), none, none)
    return step_reasons_group(s, [int(s["rank"].size)], [t], [host_index], slot_host)
