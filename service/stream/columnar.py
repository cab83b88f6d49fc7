"""Ingest v2 in the core: a host's registered topology, as the lookup tables that its envelopes'
columns are checked against (:mod:`.v2apply`).

A host registers its ranks and the communicators its records name once; the position of a comm
in that list is its code in the host's envelopes (``wire/v2.py``). The registration is checked
whole (all or nothing: a host cannot use half a dictionary) and kept under its digest; a host
keeps its last few registrations, so envelopes sealed before a change still resolve.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from failslow.service.stream.parse import parse_comm, parse_rank
from failslow.service.stream.records import CommAnnouncement, RankAnnouncement, RecordError
from failslow.service.stream.settings import Limits
from failslow.service.stream.topology import Topology
from failslow.service.stream.v2check import HostTables
from failslow.wire.topology import canonical_bytes, digest_of
from failslow.wire.v2 import NO_PEER

if TYPE_CHECKING:
    from failslow.service.stream.state import JobState

REGISTRATIONS_KEPT = 4  # per host: envelopes sealed before a change still resolve


class RegistrationError(ValueError):
    """A topology registration breaks a rule; nothing of it was applied."""

    def __init__(self, errors: list[dict[str, str]]) -> None:
        super().__init__("; ".join(f"{e['loc']}: {e['msg']}" for e in errors[:5]))
        self.errors = errors


@dataclass(frozen=True, slots=True)
class HostTopology:
    """What a host's v2 envelopes refer to, as lookup tables (:class:`v2check.HostTables`)."""

    host: str
    digest: str
    comm_size: np.ndarray  # (c,)
    tables: HostTables

    @property
    def ranks(self) -> np.ndarray:
        return self.tables.ranks  # (r,) the host's global ranks, sorted

    @property
    def comm_index(self) -> np.ndarray:
        return self.tables.comm_index  # (c,) host comm code -> the job's comm index


def check_registration(
    topo: Topology,
    ranks_raw: list[Any],
    comms_raw: list[Any],
    limits: Callable[[int], Limits] | None = None,
) -> tuple[list[RankAnnouncement], list[CommAnnouncement]]:
    """Parse and check a registration against the job without changing anything. ``limits``:
    the job's bounds once it has this many more ranks (the registration's own new ranks count,
    its declared world size does not); None: the topology's bounds as they are."""
    errors: list[dict[str, str]] = []
    ranks: list[RankAnnouncement] = []
    comms: list[CommAnnouncement] = []
    for i, raw in enumerate(ranks_raw):
        try:
            ranks.append(parse_rank(raw))
        except RecordError as exc:
            errors.append({"loc": f"ranks[{i}]", "msg": str(exc)})
            continue
        if (ranks[-1].world_size or 0) > topo.max_ranks:
            msg = f"world_size exceeds this service's {topo.max_ranks} ranks"
            errors.append({"loc": f"ranks[{i}]", "msg": msg})
    if len({r.rank for r in ranks}) != len(ranks):
        errors.append({"loc": "ranks", "msg": "ranks must be distinct"})
    names: set[str] = set()
    for i, raw in enumerate(comms_raw):
        ann = _known(topo, raw)
        if ann is None:
            try:
                ann = parse_comm(raw)
            except RecordError as exc:
                errors.append({"loc": f"comms[{i}]", "msg": str(exc)})
                continue
        existing = topo.comms.get(ann.comm)
        if ann.comm in names:
            errors.append({"loc": f"comms[{i}]", "msg": f"comm {ann.comm} listed twice"})
        elif (
            existing is not None
            and existing.ranks is not ann.ranks
            and (existing.ranks, existing.kind) != (ann.ranks, ann.kind)
        ):
            errors.append({"loc": f"comms[{i}]", "msg": f"conflicting definition of {ann.comm}"})
        names.add(ann.comm)
        comms.append(ann)
    new = [c for c in comms if c.comm not in topo.comms]
    # members of known comms are ranks of the job already: only new comms can add ranks
    members = {r for c in new for r in c.ranks} | {r.rank for r in ranks}
    new_ranks = sum(1 for r in members if r not in topo.ranks)
    max_comms, max_members = topo.max_comms, topo.max_comm_members
    if limits is not None:
        lim = limits(new_ranks)
        max_comms, max_members = max(max_comms, lim.comms), max(max_members, lim.comm_members)
    if len(topo.comms) + len(new) > max_comms:
        errors.append({"loc": "comms", "msg": f"job exceeds {max_comms} comms"})
    adding = sum(len(c.ranks) for c in new)
    if topo.comm_members + adding > max_members:
        errors.append({"loc": "comms", "msg": f"job exceeds {max_members} communicator members"})
    elif topo.budget is not None and not topo.budget.fits(adding):
        errors.append({"loc": "comms", "msg": topo.budget.refusal(adding)})
    if len(topo.ranks) + new_ranks > topo.max_ranks:
        errors.append({"loc": "ranks", "msg": f"job exceeds {topo.max_ranks} ranks"})
    if errors:
        raise RegistrationError(errors)
    return ranks, comms


FORM_MIN = 64  # members from which a comm's range form is remembered (smaller: parsed again)
_RANGE_KEYS = frozenset(("start", "stop", "step"))


def _form(raw: Any) -> tuple[str, int, int, int] | None:
    """``(kind, start, stop, step)`` of a comm written as a range of ranks; None otherwise."""
    if not isinstance(raw, dict):
        return None
    spec, kind = raw.get("ranks"), raw.get("kind")
    if not isinstance(spec, dict) or not isinstance(kind, str) or not spec.keys() <= _RANGE_KEYS:
        return None
    start, stop, step = spec.get("start"), spec.get("stop"), spec.get("step", 1)
    if type(start) is not int or type(stop) is not int or type(step) is not int:
        return None
    return kind, start, stop, step


def _known(topo: Topology, raw: Any) -> CommAnnouncement | None:
    """A comm of the job named in the very range form it was registered with: its announcement,
    with the job's own member tuple, without expanding and comparing the members again (a
    100K-rank job's data-parallel comms have 3,200 members each, and each of its 12,800 hosts
    names 8 of them). None: check it in full."""
    form = _form(raw)
    name = raw.get("comm") if form is not None else None
    if form is None or not isinstance(name, str) or topo.comm_forms.get(name) != form:
        return None
    info = topo.comms[name]
    return CommAnnouncement(name, info.kind, info.ranks)  # type: ignore[arg-type]


def _remember_forms(topo: Topology, comms_raw: list[Any]) -> None:
    """After a registration was applied: the range forms its large comms were named in."""
    for raw in comms_raw:
        form = _form(raw)
        if form is None:
            continue
        info = topo.comms.get(raw["comm"])
        if info is not None and len(info.ranks) >= FORM_MIN and info.kind == form[0]:
            topo.comm_forms[info.comm] = form


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
    tables = HostTables(
        ranks=own,
        slots=np.array([topo.ranks[r].slot for r in own.tolist()], dtype=np.int64),
        comm_index=np.array([topo.comms[c.comm].index for c in comms], dtype=np.int64),
        position=position,
        other=other,
    )
    sizes = np.array([len(c.ranks) for c in comms], dtype=np.int64)
    return HostTopology(host=host, digest=digest, comm_size=sizes, tables=tables)


class UnknownTopology(LookupError):
    """An envelope names a topology digest its host never registered (or that was forgotten)."""

    def __init__(self, host: str, digest: str, *, moved: bool = False) -> None:
        why = " (another host registered some of its ranks since)" if moved else ""
        super().__init__(
            f"host {host} has no registered topology {digest!r}{why}; register it again"
        )
        self.host, self.digest = host, digest


def check_for(
    state: JobState, ranks_raw: list[Any], comms_raw: list[Any]
) -> tuple[list[RankAnnouncement], list[CommAnnouncement]]:
    """:func:`check_registration` against the job, with the bounds it will have once the
    registration's new ranks count (raises RegistrationError; changes nothing)."""
    topo = state.topology
    return check_registration(
        topo, ranks_raw, comms_raw,
        limits=lambda adding: Limits.shown(state.settings, topo.n_slots + adding),
    )  # fmt: skip


def register_topology(
    state: JobState, host: str, ranks_raw: list[Any], comms_raw: list[Any], *, stored: bool = False
) -> HostTopology:
    """Check and apply a host's registration (all or nothing); raises RegistrationError.
    ``stored``: it comes from the database (nothing new to store)."""
    topo = state.topology
    ranks, comms = check_for(state, ranks_raw, comms_raw)
    raw = canonical_bytes(ranks_raw, comms_raw)  # of the form the host sent (checked above)
    key = digest_of(raw)
    kept = state.registrations.setdefault(host, OrderedDict())
    ht = kept.get(key)
    if ht is None:
        members = {r for c in comms if c.comm not in topo.comms for r in c.ranks}
        state.scale_limits(len((members | {r.rank for r in ranks}) - topo.ranks.keys()))
        ht = register(topo, host, key, ranks, comms)
        _remember_forms(state.topology, comms_raw)
        if not stored:
            state.new_registrations.setdefault(host, {})[key] = raw  # for the commit to store
    else:  # registered before: its ranks are this host's again (they may have moved away)
        for r in ranks:
            state.topology.announce_rank(host, r)
    stored_ones = state.stored_registrations.get(host)
    if stored_ones is not None and stored_ones.pop(key, None) is not None and not stored_ones:
        del state.stored_registrations[host]
    kept[key] = ht
    kept.move_to_end(key)
    while len(kept) > REGISTRATIONS_KEPT:
        kept.popitem(last=False)
    return ht


def lookup(state: JobState, host: str, digest: str) -> HostTopology:
    """The registration ``digest`` of ``host``: in memory, or stored before a restart (registered
    again now); raises :class:`UnknownTopology`."""
    ht = state.registrations.get(host, {}).get(digest)
    if ht is None:
        return _restore(state, host, digest)
    if _moved_away(state.topology, ht):  # another host registered some of its ranks since
        del state.registrations[host][digest]
        raise UnknownTopology(host, digest, moved=True)
    return ht


def _moved_away(topo: Topology, ht: HostTopology) -> bool:
    """Whether a rank of the registration now lives on another host. Its records would all be
    rejected (``WRONG_HOST``) while the agent, answered 200, would never register again; a 409
    has it register again instead, which brings the ranks back (the latest registration wins)."""
    slots = ht.tables.slots
    return bool(slots.size) and bool(
        (topo.slot_host[slots] != topo.host_ids.get(ht.host, -1)).any()
    )


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
