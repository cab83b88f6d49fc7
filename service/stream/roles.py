"""From a job's topology to what plans speak about: data-parallel indices, rings, work shares."""

from __future__ import annotations

import numpy as np

from failslow.service.stream.topology import Topology

RING_KINDS = ("dp", "tp", "ep", "cp", "world", "other")


def dp_index(topo: Topology) -> tuple[dict[int, int], int]:
    """``(rank -> data-parallel index, data-parallel size)`` from the announced ``dp`` comms
    (a rank's position in its data-parallel group is its data-parallel rank)."""
    dp_of: dict[int, int] = {}
    size = 0
    for comm in topo.comm_list:
        if comm.kind != "dp":
            continue
        size = max(size, len(comm.ranks))
        for i, r in enumerate(comm.ranks):
            dp_of.setdefault(r, i)
    return dp_of, size


def rings(topo: Topology) -> dict[str, tuple[int, ...]]:
    """Communicators whose ring crosses hosts: the ones a re-plan can re-order."""
    out: dict[str, tuple[int, ...]] = {}
    for comm in topo.comm_list:
        if comm.kind not in RING_KINDS or len(comm.ranks) < 3:
            continue
        hosts = {topo.ranks[r].host for r in comm.ranks if r in topo.ranks}
        if len(hosts) >= 2:
            out[comm.comm] = comm.ranks
    return out


def work_weights(topo: Topology, shares: list[int] | None) -> np.ndarray | None:
    """Per rank slot: its data-parallel rank's share relative to the mean share (None = equal)."""
    if not shares:
        return None
    dp_of, size = dp_index(topo)
    if size != len(shares):
        return None
    mean = sum(shares) / len(shares)
    out = np.ones(topo.n_slots)
    for r, d in dp_of.items():
        info = topo.ranks.get(r)
        if info is not None and info.slot < out.size:
            out[info.slot] = shares[d] / mean
    return out
