"""Views of a job's state that detectors take as input (built under the job lock)."""

from __future__ import annotations

import numpy as np

from failslow.detectors.hang import BlockedCollective, HangSnapshot
from failslow.detectors.hang_input import measured_floor_s, vouched_floor_s
from failslow.detectors.types import KIND_INDEX, P2P, JobShape, PeerGroups
from failslow.detectors.vocab import CommKind
from failslow.service.stream.frames import NEVER
from failslow.service.stream.state import JobState
from failslow.service.stream.topology import Topology
from failslow.wire.v2 import NO_END

# comms whose members do equal work at the same time: a rank's compute is compared with theirs
ROLE_KINDS = (CommKind.TP, CommKind.DP)
# roughly equal work (MoE routing, sequence shards): role peers only in a job without the above,
# so that they never veto a straggler (issue 16)
ADVISORY_ROLE_KINDS = (CommKind.EP, CommKind.CP)
# role groups whose members are usually on different hosts (a slow node against the others)
CROSS_KINDS = (CommKind.DP, CommKind.EP, CommKind.CP)


def job_shape(topo: Topology) -> JobShape:
    """Dense arrays of hosts, role groups and ring edges. Host indices follow first appearance,
    so they stay stable as hosts join."""
    hosts = tuple(topo.hosts)
    host_index = {h: i for i, h in enumerate(hosts)}
    host_of_slot = np.array(
        [host_index.get(topo.ranks[r].host or "", -1) for r in topo.slot_rank], dtype=np.int64
    )
    comms = topo.comm_list
    groups = [c.slots for c in comms if c.kind in ROLE_KINDS]
    if not groups:
        groups = [c.slots for c in comms if c.kind in ADVISORY_ROLE_KINDS]
    if not groups:
        groups = [c.slots for c in comms if c.kind == CommKind.WORLD]
    if not groups and topo.n_slots >= 2:
        groups = [np.arange(topo.n_slots)]
    comm_hosts: list[tuple[int, ...]] = []
    comm_edges: list[frozenset[tuple[int, int]]] = []
    cross: list[np.ndarray] = []
    for c in comms:
        ring = [int(host_of_slot[s]) for s in c.slots if s < host_of_slot.size]
        known = [h for h in ring if h >= 0]
        comm_hosts.append(tuple(sorted(set(known))))
        edges = set()
        n = len(ring)
        for i in range(n if n > 2 else n - 1):
            a, b = ring[i], ring[(i + 1) % n]
            if a >= 0 and b >= 0 and a != b:
                edges.add((min(a, b), max(a, b)))
        comm_edges.append(frozenset(edges))
        if c.kind in CROSS_KINDS and len(set(known)) >= 2:
            cross.append(c.slots)
    if not cross:
        cross = [
            c.slots for c in comms if c.kind == CommKind.WORLD and len(comm_hosts[c.index]) >= 2
        ]
    kinds = np.array(
        [P2P if c.kind == CommKind.P2P else KIND_INDEX[c.kind] for c in comms], dtype=np.int64
    )
    edge_id: dict[tuple[int, int], int] = {}
    ch = [(i, h) for i, hs in enumerate(comm_hosts) for h in hs]
    ce = [(i, edge_id.setdefault(e, len(edge_id))) for i, es in enumerate(comm_edges) for e in es]
    # A communicator re-created with the same members (a re-plan changes only its ring order)
    # inherits its predecessor's history: the newest earlier comm with the same kind and members.
    parent = np.full(len(comms), -1, dtype=np.int64)
    seen: dict[tuple[str, tuple[int, ...]], int] = {}
    for c in comms:
        key = (c.kind, tuple(sorted(c.ranks)))
        if key in seen:
            parent[c.index] = seen[key]
        seen[key] = c.index
    ch_arr = np.array(ch, dtype=np.int64).reshape(-1, 2)
    ce_arr = np.array(ce, dtype=np.int64).reshape(-1, 2)
    return JobShape(
        hosts=hosts,
        host_of_slot=host_of_slot,
        groups=PeerGroups.from_groups(groups),
        cross_groups=PeerGroups.from_groups(cross),
        comm_kind=kinds,
        comm_size=np.array([len(c.ranks) for c in comms], dtype=np.int64),
        comm_hosts=tuple(comm_hosts),
        comm_edges=tuple(comm_edges),
        ch_comm=ch_arr[:, 0],
        ch_host=ch_arr[:, 1],
        ce_comm=ce_arr[:, 0],
        ce_edge=ce_arr[:, 1],
        edges=np.array(sorted(edge_id, key=edge_id.__getitem__), dtype=np.int64).reshape(-1, 2),
        comm_parent=parent,
    )


def blocked_collectives(
    state: JobState, *, older_than_ns: int, typical: np.ndarray
) -> list[BlockedCollective]:
    """Incomplete collectives whose first member entered before ``older_than_ns`` and, when
    there are any, every younger one that a member is inside: ranks waiting there wait for
    someone else, and the hang detector follows them to whoever that is (scanned in arrival
    order, see :meth:`Joiner.groups`), at most :data:`MAX_BLOCKED` of them: when ingest lags,
    thousands of collectives of a large job are incomplete at once, and the oldest are where a
    hang's wait chains start. Only those a member reported being inside: the hang detector
    passes over the others (every member it heard from completed it, the rest are merely late),
    and they must not use up the limit."""
    out: list[BlockedCollective] = []
    comms = state.topology.comm_list
    newest = state.frames.newest_end
    groups = state.blocked_groups(older_than_ns)
    shift = slot_offsets(state, state.cadence.offsets_ns(), newest.size)
    for g in groups:
        comm = comms[g.comm]
        n = len(comm.ranks)
        starts: list[int | None] = [None] * n
        ends: list[int | None] = [None] * n
        for p, s, e in zip(g.positions.tolist(), g.starts.tolist(), g.ends.tolist(), strict=True):
            d = int(shift[comm.slots[p]]) if shift is not None else 0
            starts[p] = s + d
            ends[p] = None if e == NO_END else e + d
        t = float(typical[g.comm]) if g.comm < typical.size else float("nan")
        slots = comm.slots[comm.slots < newest.size]
        ends_of = newest[slots]
        if shift is not None:
            ends_of = np.where(ends_of != NEVER, ends_of + shift[slots], NEVER)
        progress = max(0, int(ends_of.max())) if slots.size else 0  # (NEVER: none ended yet)
        out.append(
            BlockedCollective(
                comm.comm, g.seq, comm.ranks, tuple(starts), tuple(ends), t, g.seen_ns, progress
            )
        )
    return out


def slot_offsets(state: JobState, offsets: dict[str, int], size: int) -> np.ndarray | None:
    """Per rank slot (at least ``size`` of them), by how much its host's times are moved on
    into the job's (``offsets``: :meth:`~failslow.service.stream.quiet.HostCadence.offsets_ns`);
    None where no host has an offset (the usual case: nothing to build)."""
    if not offsets:
        return None
    topo = state.topology
    by_id = np.zeros(len(topo.host_ids) + 1, np.int64)  # [-1]: a slot of no known host
    for host, d in offsets.items():
        if host in topo.host_ids:
            by_id[topo.host_ids[host]] = d
    out = np.zeros(max(size, topo.slot_host.size), np.int64)
    out[: topo.slot_host.size] = by_id[topo.slot_host]
    return out


def hang_snapshot(
    state: JobState,
    blocked: list[BlockedCollective],
    *,
    step_time_s: float,
) -> HangSnapshot:
    """What the hang detector sees of a job now (under the job lock): the blocked collectives,
    where every rank lives, when each host last reported, and when each member of a blocked
    collective last completed something (a collective or a step) and its longest recent gap
    between two completed calls."""
    topo = state.topology
    newest_step = state.frames.newest_end
    last_call = state.joiner.last_end
    last_end: dict[int, int] = {}
    gaps: dict[int, float] = {}
    quiet = state.joiner.quiet
    host_off = state.cadence.offsets_ns()
    shift = slot_offsets(state, host_off, max(last_call.size, newest_step.size))
    for b in blocked:
        for r in b.members:
            if r in last_end:
                continue
            end = 0
            info = topo.ranks.get(r)
            if info is not None and info.slot < last_call.size:
                end = int(last_call[info.slot])
            if info is not None and info.slot < newest_step.size:
                step_end = int(newest_step[info.slot])
                if step_end != NEVER:
                    end = max(end, step_end)
            if end and shift is not None and info is not None:
                end += int(shift[info.slot])
            last_end[r] = end
            if info is not None:
                gap = quiet.longest_s(info.slot)
                if gap == gap:
                    gaps[r] = gap
    return HangSnapshot(
        now_ns=state.watermark_ns,
        blocked=tuple(blocked),
        host_of_rank={r: i.host for r, i in topo.ranks.items() if i.host is not None},
        host_last_ns={h: i.last_sent_ns + host_off.get(h, 0) for h, i in topo.hosts.items()},
        last_progress_ns=state.frames.last_progress_ns,
        step_time_s=step_time_s,
        rank_last_end=last_end,
        rank_gap_s=gaps,
        inflight_after_s=state.inflight_delay.delay_s(),
        host_vouch={h: (c + host_off.get(h, 0), a) for h, (c, a) in host_vouch(state).items()},
        delivery_lag_s=state.delivery_lag.lag_s(),
        reorder_s=state.delivery_lag.reorder_s(),
        host_cadence_s=state.cadence.longest_s(),
    )


def host_vouch(state: JobState) -> dict[str, tuple[int, float]]:
    """Per host that vouches for what it sent: ``(complete_ns, inflight_after_s)``."""
    return {h: (i.complete_ns, i.inflight_after_ns / 1e9)
            for h, i in state.topology.hosts.items() if i.inflight_after_ns >= 0}  # fmt: skip


def blocked_before_ns(state: JobState, floor_s: float) -> int:
    """The collectives the hang detector is given began before this: the smallest timeout it
    may apply ago, the configured floor or, where every host vouches for what it sent, the
    delay they announced (:func:`~failslow.detectors.hang_input.vouched_floor_s`), else the
    floor the job's measured delays give where lower
    (:func:`~failslow.detectors.hang_input.measured_floor_s`); a stopped rank on 0.4 s steps was
    otherwise never judged before its peers had waited the full floor."""
    floor = vouched_floor_s(state.topology.hosts.keys(), host_vouch(state))
    if floor is None:
        lag = state.delivery_lag
        floor = measured_floor_s(floor_s, lag.lag_s(), state.inflight_delay.delay_s(),
                                 lag.reorder_s())  # fmt: skip
    return state.watermark_ns - int(min(floor_s, floor) * 1e9)
