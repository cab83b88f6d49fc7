"""Ingest v2 in the core: a host's registered topology, and an envelope's columns checked against
it with whole-array operations (one rejection per bad record, as in v1; no object per record).

A host registers its ranks and the communicators its records name once; the position of a comm
in that list is its code in the host's envelopes (``wire/v2.py``). The registration is checked
whole (all or nothing: a host cannot use half a dictionary) and kept under its digest; a host
keeps its last few registrations, so envelopes sealed before a change still resolve.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from failslow.service.stream import v2check
from failslow.service.stream.parse import parse_comm, parse_rank
from failslow.service.stream.records import (
    CommAnnouncement,
    RankAnnouncement,
    RecordError,
    RecordKind,
    Reject,
)
from failslow.service.stream.topology import Topology
from failslow.wire.topology import canonical_bytes, digest_of
from failslow.wire.v2 import NO_PEER, Columns

if TYPE_CHECKING:
    from failslow.service.stream.state import ApplyResult, JobState

REGISTRATIONS_KEPT = 4  # per host: envelopes sealed before a change still resolve



class RegistrationError(ValueError):
    """A topology registration breaks a rule; nothing of it was applied."""

    def __init__(self, errors: list[dict[str, str]]) -> None:
        super().__init__("; ".join(f"{e['loc']}: {e['msg']}" for e in errors[:5]))
        self.errors = errors


@dataclass(frozen=True, slots=True)
class HostTopology:
    """What a host's v2 envelopes refer to, as lookup tables."""

    host: str
    digest: str
    ranks: np.ndarray  # (r,) the host's global ranks, sorted
    slots: np.ndarray  # (r,) their slots in the job
    comm_index: np.ndarray  # (c,) host comm code -> the job's comm index
    comm_size: np.ndarray  # (c,)
    position: np.ndarray  # (c, r) member position of each host rank in each comm, -1: none
    other: np.ndarray  # (c, r) for two-member comms: the other member's global rank, else -1


def check_registration(
    topo: Topology, ranks_raw: list[Any], comms_raw: list[Any]
) -> tuple[list[RankAnnouncement], list[CommAnnouncement]]:
    """Parse and check a registration against the job without changing anything."""
    errors: list[dict[str, str]] = []
    ranks: list[RankAnnouncement] = []
    comms: list[CommAnnouncement] = []
    for i, raw in enumerate(ranks_raw):
        try:
            ranks.append(parse_rank(raw))
        except RecordError as exc:
            errors.append({"loc": f"ranks[{i}]", "msg": str(exc)})
    if len({r.rank for r in ranks}) != len(ranks):
        errors.append({"loc": "ranks", "msg": "ranks must be distinct"})
    names: set[str] = set()
    for i, raw in enumerate(comms_raw):
        try:
            ann = parse_comm(raw)
        except RecordError as exc:
            errors.append({"loc": f"comms[{i}]", "msg": str(exc)})
            continue
        existing = topo.comms.get(ann.comm)
        if ann.comm in names:
            errors.append({"loc": f"comms[{i}]", "msg": f"comm {ann.comm} listed twice"})
        elif existing is not None and (existing.ranks, existing.kind) != (ann.ranks, ann.kind):
            errors.append({"loc": f"comms[{i}]", "msg": f"conflicting definition of {ann.comm}"})
        names.add(ann.comm)
        comms.append(ann)
    new = [c for c in comms if c.comm not in topo.comms]
    if len(topo.comms) + len(new) > topo.max_comms:
        errors.append({"loc": "comms", "msg": f"job exceeds {topo.max_comms} comms"})
    adding = sum(len(c.ranks) for c in new)
    if topo.comm_members + adding > topo.max_comm_members:
        errors.append(
            {"loc": "comms", "msg": f"job exceeds {topo.max_comm_members} communicator members"}
        )
    elif topo.budget is not None and not topo.budget.fits(adding):
        errors.append({"loc": "comms", "msg": topo.budget.refusal(adding)})
    # members of known comms are ranks of the job already: only new comms can add ranks
    members = {r for c in new for r in c.ranks} | {r.rank for r in ranks}
    if len(topo.ranks) + sum(1 for r in members if r not in topo.ranks) > topo.max_ranks:
        errors.append({"loc": "ranks", "msg": f"job exceeds {topo.max_ranks} ranks"})
    if errors:
        raise RegistrationError(errors)
    return ranks, comms


def register(
    topo: Topology, host: str, digest: str, ranks: list[RankAnnouncement],
    comms: list[CommAnnouncement],
) -> HostTopology:  # fmt: skip
    """Apply a checked registration to the job's topology; the host's lookup tables."""
    for r in ranks:
        topo.announce_rank(host, r)
    for c in comms:
        topo.announce_comm(c)
    own = np.array(sorted(r.rank for r in ranks), dtype=np.int64)
    col = {int(r): i for i, r in enumerate(own.tolist())}
    position = np.full((len(comms), own.size), -1, np.int64)
    other = np.full((len(comms), own.size), NO_PEER, np.int64)
    for ci, c in enumerate(comms):
        where = topo.comms[c.comm].position  # rank -> position: only the host's ranks are looked up
        for r, j in col.items():
            p = where.get(r)
            if p is None:
                continue
            position[ci, j] = p
            if len(c.ranks) == 2:
                other[ci, j] = c.ranks[1 - p]
    return HostTopology(
        host=host,
        digest=digest,
        ranks=own,
        slots=np.array([topo.ranks[r].slot for r in own.tolist()], dtype=np.int64),
        comm_index=np.array([topo.comms[c.comm].index for c in comms], dtype=np.int64),
        comm_size=np.array([len(c.ranks) for c in comms], dtype=np.int64),
        position=position,
        other=other,
    )


@dataclass(slots=True)
class Checked:
    """The result of checking an envelope's columns."""

    members: dict[str, np.ndarray]  # the valid collectives, as the joiner stages them
    steps: dict[str, np.ndarray]  # the valid step records (rank slot, step, start, end) + index
    rejected: list[dict[str, str]]
    reasons: list[Reject]


def _reject(
    reason: np.ndarray,
    rules: tuple[tuple[Reject, str], ...],
    column: str,
    rejected: list[dict[str, str]],
    reasons: list[Reject],
) -> None:
    """One rejection per record whose ``reason`` (1-based into ``rules``) is set."""
    for i in np.flatnonzero(reason).tolist():
        code, msg = rules[int(reason[i]) - 1]
        rejected.append({"index": f"{column}[{i}]", "reason": msg})
        reasons.append(code)


def check_columns(
    cols: Columns,
    ht: HostTopology,
    slot_host: np.ndarray,
    host_index: int,
    seen_ns: int,
    *,
    jit: bool = False,
) -> Checked:
    """Check every record of ``cols`` at once; the valid ones come out ready to stage. ``jit``:
    with the compiled checks (see :mod:`v2check`)."""
    c = cols.collectives
    reason, code, slot, pos = v2check.reasons(
        c, ht.ranks, ht.slots, ht.position, ht.other, slot_host, host_index, jit=jit
    )
    rejected: list[dict[str, str]] = []
    reasons: list[Reject] = []
    if reason.any():
        _reject(reason, v2check.RULES, "collectives", rejected, reasons)
        ok = reason == 0
        code, slot, pos = code[ok], slot[ok], pos[ok]
        c = {k: v[ok] for k, v in c.items()}
    n = int(code.size)
    members = {
        "comm": ht.comm_index[code] if ht.comm_index.size else code,
        "seq": c["seq"].astype(np.int64, copy=False),
        "pos": pos,
        "slot": slot,
        "op": c["op"].astype(np.uint8, copy=False),
        "nbytes": c["bytes"].astype(np.int64, copy=False),
        "start": c["start_ns"].astype(np.int64, copy=False),
        "end": c["end_ns"].astype(np.int64, copy=False),
        "seen": np.full(n, seen_ns, np.int64),
    }
    s = cols.steps
    sreason, sslot = v2check.step_reasons(s, ht.ranks, ht.slots, slot_host, host_index, jit=jit)
    if "work" in s:  # optional column: NaN (not said) or a positive finite number
        w = s["work"]
        bad = (sreason == 0) & ~(np.isnan(w) | ((w > 0) & np.isfinite(w)))
        if bad.any():
            sreason = np.where(bad, len(v2check.STEP_RULES), sreason)
    index = np.arange(sreason.size)
    if sreason.any():
        _reject(sreason, v2check.STEP_RULES, "steps", rejected, reasons)
        sok = sreason == 0
        index, sslot, s = index[sok], sslot[sok], {k: v[sok] for k, v in s.items()}
    steps = {
        "index": index,
        "slot": sslot,
        "rank": s["rank"].astype(np.int64, copy=False),
        "step": s["step"].astype(np.int64, copy=False),
        "start": s["start_ns"].astype(np.int64, copy=False),
        "end": s["end_ns"].astype(np.int64, copy=False),
    }
    if "work" in s:
        steps["work"] = s["work"].astype(np.float64, copy=False)
    return Checked(members, steps, rejected, reasons)



class UnknownTopology(LookupError):
    """An envelope names a topology digest its host never registered (or that was forgotten)."""

    def __init__(self, host: str, digest: str) -> None:
        super().__init__(f"host {host} has no registered topology {digest!r}; register it again")
        self.host, self.digest = host, digest


def register_topology(
    state: JobState, host: str, ranks_raw: list[Any], comms_raw: list[Any], *, stored: bool = False
) -> HostTopology:
    """Check and apply a host's registration (all or nothing); raises RegistrationError.
    ``stored``: it comes from the database (nothing new to store)."""
    declared = [r.get("world_size") for r in ranks_raw if isinstance(r, dict)]
    state.scale_limits(max((w for w in declared if isinstance(w, int)), default=None))
    ranks, comms = check_registration(state.topology, ranks_raw, comms_raw)
    raw = canonical_bytes(ranks_raw, comms_raw)  # of the form the host sent (checked above)
    key = digest_of(raw)
    kept = state.registrations.setdefault(host, OrderedDict())
    ht = kept.get(key)
    if ht is None:
        ht = register(state.topology, host, key, ranks, comms)
        if not stored:
            state.new_registrations.setdefault(host, {})[key] = raw  # for the commit to store
    stored_ones = state.stored_registrations.get(host)
    if stored_ones is not None and stored_ones.pop(key, None) is not None and not stored_ones:
        del state.stored_registrations[host]
    kept[key] = ht
    kept.move_to_end(key)
    while len(kept) > REGISTRATIONS_KEPT:
        kept.popitem(last=False)
    return ht


def _restore(state: JobState, host: str, key: str) -> HostTopology:
    """A registration stored before a restart, registered again; else UnknownTopology."""
    raw = state.stored_registrations.get(host, {}).get(key)
    if raw is None:
        raise UnknownTopology(host, key)
    try:
        canon = orjson.loads(raw)
        return register_topology(state, host, canon["ranks"], canon["comms"], stored=True)
    except (RegistrationError, orjson.JSONDecodeError, KeyError, TypeError):
        state.stored_registrations[host].pop(key, None)  # the host registers it again
        raise UnknownTopology(host, key) from None


def apply_v2(state: JobState, header: dict[str, Any], cols: Columns) -> ApplyResult:
    """Apply a v2 envelope whose header was checked (job, host, sent_ns, agent, batch_seq,
    topology); raises UnknownTopology before anything is applied."""
    host, sent_ns = header["host"], header["sent_ns"]
    agent, batch_seq = header.get("agent"), header.get("batch_seq")
    ht = state.registrations.get(host, {}).get(header["topology"])
    if ht is None:
        ht = _restore(state, host, header["topology"])
    result = state.begin(host, sent_ns, agent, batch_seq, cols.n_collectives + cols.n_steps)
    if result.batch_duplicate:
        return result
    topo = state.topology
    checked = check_columns(
        cols, ht, topo.slot_host, topo.host_ids.get(host, -1), state.watermark_ns,
        jit=state.frames.jit,
    )  # fmt: skip
    result.rejected, result.reasons = checked.rejected, checked.reasons
    state.stage(checked.members)
    result.count(RecordKind.COLLECTIVE, int(checked.members["comm"].size))
    s = checked.steps
    fresh, errors = state.add_steps(s["slot"], s["step"], s["start"], s["end"], s.get("work"))
    for i, exc in errors:
        result.reject(f"steps[{int(s['index'][i])}]", exc)
    new = int(fresh.sum())
    result.count(RecordKind.STEP, new, int(fresh.size) - new - len(errors))
    return state.finish(result, host, sent_ns, agent, batch_seq)
