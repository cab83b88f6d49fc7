"""Applying v2 envelopes: their columns checked against the host's registered tables with one
compiled pass (or whole-array numpy), one rejection per bad record as in v1, and no object per
record.

Envelopes of one job that arrive together are applied together (:func:`apply_v2_many`): each
is claimed on its own (stream position, duplicate check, the event clock, in arrival order),
then the columns of all of them are joined end to end and checked, staged and stepped by one
call each. The result is what applying them one by one gives (tests/service/stream/
test_v2apply.py compares every answer, counter and frame array), at a fraction of the fixed
cost per envelope: numpy's and numba's cost per call, not the arithmetic, is what an envelope
of a few hundred records pays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from failslow.service.stream import v2check
from failslow.service.stream.columnar import HostTopology, UnknownTopology, lookup
from failslow.service.stream.records import RecordKind, Reject
from failslow.wire.v2 import NO_END, Layout, concat

if TYPE_CHECKING:
    from failslow.service.stream.state import ApplyResult, JobState


@dataclass(slots=True)
class _Claimed:
    """An envelope claimed for applying: what its records are checked against."""

    result: ApplyResult
    header: dict[str, Any]
    body: bytes
    layout: Layout
    ht: HostTopology
    host_index: int
    seen_ns: int  # the job's event time once it was claimed
    oldest_end_ns: int | None = None  # of the calls and steps it completed (delivery lag)


def apply_v2(state: JobState, header: dict[str, Any], body: bytes, layout: Layout) -> ApplyResult:
    """Apply one v2 envelope whose header was checked; raises UnknownTopology before anything
    is applied."""
    (out,) = apply_v2_many(state, [(header, body, layout)])
    if isinstance(out, UnknownTopology):
        raise out
    return out


def apply_v2_many(
    state: JobState, envelopes: list[tuple[dict[str, Any], bytes, Layout]]
) -> list[ApplyResult | UnknownTopology]:
    """Apply envelopes of one job in order (headers checked: job, host, sent_ns, agent,
    batch_seq, topology); per envelope its result, or the UnknownTopology it names (nothing of
    that one is applied). Call under the job's lock."""
    out: list[ApplyResult | UnknownTopology] = []
    run: list[_Claimed] = []
    topo = state.topology
    for header, body, layout in envelopes:
        host, digest = header["host"], header["topology"]
        if digest not in state.registrations.get(host, {}) and run:
            _apply(state, run)  # registering a stored topology again may move ranks: as in order
            run = []
        try:
            ht = lookup(state, host, digest)
        except UnknownTopology as exc:
            out.append(exc)
            continue
        result = state.begin(host, header["sent_ns"], header.get("agent"),
                             header.get("batch_seq"), layout.collectives + layout.steps,
                             claim=True)  # fmt: skip
        out.append(result)
        if not result.batch_duplicate:
            run.append(_Claimed(result, header, body, layout, ht, topo.host_ids.get(host, -1),
                                state.watermark_ns))  # fmt: skip
    if run:
        _apply(state, run)
    state.settle()
    return out


def _apply(state: JobState, claimed: list[_Claimed]) -> None:
    """Check, stage and step claimed envelopes together (in runs with the same columns)."""
    lo = 0
    for hi in range(1, len(claimed) + 1):
        if hi == len(claimed) or claimed[hi].layout.work != claimed[lo].layout.work:
            _apply_run(state, claimed[lo:hi])
            lo = hi
    for c in claimed:
        h = c.header
        state.topology.vouch(h["host"], h.get("complete_ns"), h.get("inflight_after_ns"))
        state.delivery_lag.note(h["host"], h["sent_ns"], c.oldest_end_ns)
        state.finish(c.result, h["host"], h["sent_ns"], h.get("agent"), h.get("batch_seq"),
                     settle=False)  # fmt: skip


def _apply_run(state: JobState, run: list[_Claimed]) -> None:
    topo = state.topology
    cols = concat([c.body for c in run], [c.layout for c in run])
    tables = [c.ht.tables for c in run]
    hosts = [c.host_index for c in run]
    jit = state.frames.jit
    ccounts = [c.layout.collectives for c in run]
    c = cols.collectives
    reason, comm, slot, pos = v2check.reasons(c, ccounts, tables, hosts, topo.slot_host, jit=jit)
    env = _envelope_of(ccounts)
    seen = np.repeat(np.array([x.seen_ns for x in run], np.int64), ccounts)
    sent = np.repeat(np.array([x.header["sent_ns"] for x in run], np.int64), ccounts)
    state.inflight_delay.note(sent, c["start_ns"], c["end_ns"])
    if reason.any():
        _reject(run, reason, v2check.RULES, "collectives", ccounts)
        ok = reason == 0
        comm, slot, pos, env, seen = comm[ok], slot[ok], pos[ok], env[ok], seen[ok]
        c = {k: v[ok] for k, v in c.items()}
    state.stage({
        "comm": comm, "seq": c["seq"].astype(np.int64, copy=False), "pos": pos, "slot": slot,
        "op": c["op"].astype(np.uint8, copy=False),
        "nbytes": c["bytes"].astype(np.int64, copy=False),
        "start": c["start_ns"].astype(np.int64, copy=False),
        "end": c["end_ns"].astype(np.int64, copy=False), "seen": seen,
    })  # fmt: skip
    per_env = np.bincount(env, minlength=len(run)).tolist()
    for x, n in zip(run, per_env, strict=True):
        x.result.count(RecordKind.COLLECTIVE, n)
    ended = c["end_ns"].astype(np.int64, copy=False) != NO_END
    _note_oldest(run, env[ended], c["end_ns"][ended])
    _apply_steps(state, run, cols.steps, jit)


def _apply_steps(state: JobState, run: list[_Claimed], s: dict[str, np.ndarray], jit: bool) -> None:
    scounts = [x.layout.steps for x in run]
    if not sum(scounts):
        return
    tables = [x.ht.tables for x in run]
    hosts = [x.host_index for x in run]
    sreason, sslot = v2check.step_reasons(
        s, scounts, tables, hosts, state.topology.slot_host, jit=jit
    )
    if "work" in s:  # optional column: NaN (not said) or a positive finite number
        w = s["work"]
        bad = (sreason == 0) & ~(np.isnan(w) | ((w > 0) & np.isfinite(w)))
        if bad.any():
            sreason = np.where(bad, len(v2check.STEP_RULES), sreason)
    index = np.arange(sreason.size)
    if sreason.any():
        _reject(run, sreason, v2check.STEP_RULES, "steps", scounts)
        ok = sreason == 0
        index, sslot, s = index[ok], sslot[ok], {k: v[ok] for k, v in s.items()}
    work = s["work"].astype(np.float64, copy=False) if "work" in s else None
    fresh, errors = state.add_steps(
        sslot, s["step"].astype(np.int64, copy=False), s["start_ns"].astype(np.int64, copy=False),
        s["end_ns"].astype(np.int64, copy=False), work,
    )  # fmt: skip
    bounds = np.cumsum(scounts)
    env = np.searchsorted(bounds, index, side="right")
    first = bounds - np.asarray(scounts)
    for i, exc in errors:
        e = int(env[i])
        run[e].result.reject(f"steps[{int(index[i] - first[e])}]", exc)
    _note_oldest(run, env[fresh], s["end_ns"][fresh])
    new = np.bincount(env[fresh], minlength=len(run)).tolist()
    given = np.bincount(env, minlength=len(run)).tolist()
    failed = np.bincount(np.array([int(env[i]) for i, _ in errors], np.int64),
                         minlength=len(run)).tolist()  # fmt: skip
    for x, n, g, f in zip(run, new, given, failed, strict=True):
        x.result.count(RecordKind.STEP, n, g - n - f)


def _note_oldest(run: list[_Claimed], env: np.ndarray, end: np.ndarray) -> None:
    """Each envelope's oldest completion among ``end`` (its index in ``run`` by ``env``)."""
    if not end.size:
        return
    oldest = np.full(len(run), np.iinfo(np.int64).max, np.int64)
    np.minimum.at(oldest, env, end.astype(np.int64, copy=False))
    for x, o in zip(run, oldest.tolist(), strict=True):
        if o != np.iinfo(np.int64).max:
            x.oldest_end_ns = o if x.oldest_end_ns is None else min(x.oldest_end_ns, o)


def _envelope_of(counts: list[int]) -> np.ndarray:
    return np.repeat(np.arange(len(counts), dtype=np.int64), counts)


def _reject(
    run: list[_Claimed],
    reason: np.ndarray,
    rules: tuple[tuple[Reject, str], ...],
    column: str,
    counts: list[int],
) -> None:
    """One rejection per record whose ``reason`` (1-based into ``rules``) is set, in its own
    envelope's answer with its index there."""
    bounds = np.cumsum(counts)
    bad = np.flatnonzero(reason)
    env = np.searchsorted(bounds, bad, side="right")
    for i, e in zip(bad.tolist(), env.tolist(), strict=True):
        code, msg = rules[int(reason[i]) - 1]
        result = run[e].result
        result.rejected.append({"index": f"{column}[{i - int(bounds[e] - counts[e])}]",
                                "reason": msg})  # fmt: skip
        result.reasons.append(code)
