"""Which NICs and cables explain a frame's slow communicators, several at once.

A component (one host's NIC, or the cable between two hosts) *explains* the slow communicators
that cross it. With one fault, one component explains nearly all of them (C4's "syndrome"); with
two faults at once (a slow NIC while a slow cable or another NIC is open) no single component
does, and a single-fault fit finds nothing — or blames whatever the two share. So:

1. the components of open incidents (``known``) explain their communicators first (and stay
   suspects while most of those are slow); a new cause is placed on what remains;
2. the component that fits best (F1 between "crosses it" and "is slow", over the communicators
   not yet explained) is named, its communicators set aside, and the rest explained again, up
   to ``MAX_CAUSES`` components. The first must fit as a single fault would (F1 >= ``min_fit``)
   unless none does; every other one (and all, when none does) must have most of its own
   communicators slow (precision >= ``min_fit``);
3. the components together must explain at least ``min_fit`` of the slow communicators, or
   none is named (scattered slowness is no component's).

A NIC and a cable that fit equally well (every communicator of the host crosses that one cable,
or the host's other communicators were left out of the frame because a rank there computes
slowly) are told apart by the communicators that were left out: when those still move data at
their usual rate, the NIC is not slow, the cable is (``left_fine``). Communicators set aside for
an earlier cause cannot say: one cable, the smaller claim, is named then; where several cables
fit alike, the one NIC at their meeting point is. The peer reference of ``link.py`` leaves out
the communicators of open NIC and cable incidents for the same reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from failslow.detectors.types import JobShape
from failslow.detectors.vocab import Subject

MAX_CAUSES = 3  # components named in one frame
TOL = 1e-9

# (hosts, transfer slowdown, candidate edges) of a suspect NIC or set of host pairs
LinkSuspect = tuple[tuple[str, ...], float, tuple[tuple[str, str], ...]]


@dataclass(frozen=True, slots=True)
class Evidence:
    """One frame's communicators, as the localisation sees them (arrays over comms)."""

    data: np.ndarray  # bool: judged in this frame
    bad: np.ndarray  # bool: slow in this frame
    left: np.ndarray  # bool: left out (through a compute-slow host) but with data
    left_fine: np.ndarray  # bool: ... and moving data at its usual rate


def host_fraction(shape: JobShape, ev: Evidence) -> np.ndarray:
    """Per host: slow cross-host comms / cross-host comms with data (NaN without data)."""
    n = ev.data.size
    keep = shape.ch_comm < n
    ch_comm, ch_host = shape.ch_comm[keep], shape.ch_host[keep]
    total = np.bincount(ch_host[ev.data[ch_comm]], minlength=shape.n_hosts).astype(float)
    slow = np.bincount(ch_host[ev.bad[ch_comm]], minlength=shape.n_hosts).astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(total > 0, slow / total, np.nan)


def localise(
    shape: JobShape,
    ev: Evidence,
    *,
    min_fit: float,
    matters: Callable[[np.ndarray], bool],
    slowdown: Callable[[np.ndarray], float],
    known: dict[Subject, LinkSuspect] | None = None,
) -> dict[Subject, LinkSuspect]:
    """The components that together explain the slow communicators (see the module doc).
    ``matters(mask)``: whether the slow comms in ``mask`` cost the job enough to report;
    ``slowdown(mask)``: their transfer slowdown; ``known``: the components of open incidents."""
    n = ev.data.size
    n_bad = int(ev.bad.sum())
    if not n_bad:
        return {}
    keep_h = shape.ch_comm < n
    ch_comm, ch_host = shape.ch_comm[keep_h], shape.ch_host[keep_h]
    keep_e = shape.ce_comm < n
    ce_comm, ce_edge = shape.ce_comm[keep_e], shape.ce_edge[keep_e]
    n_hosts, n_edges = shape.n_hosts, shape.edges.shape[0]
    left_n = np.bincount(ch_host[ev.left[ch_comm]], minlength=n_hosts)
    left_ok = np.bincount(ch_host[ev.left_fine[ch_comm]], minlength=n_hosts)
    data, bad = ev.data.copy(), ev.bad.copy()
    found: list[tuple[Subject, LinkSuspect, np.ndarray]] = []
    # the open incidents' components explain their comms first: a new cause is placed on
    # what remains (a second NIC would otherwise tie with the first on the comms they share)
    for subject, (hosts, _, edges) in (known or {}).items():
        covered = crossing(shape, n, hosts, edges)
        slow_n, data_n = int((bad & covered).sum()), int((data & covered).sum())
        if slow_n and slow_n >= min_fit * data_n:  # still slow: still a suspect
            found.append((subject, (hosts, slowdown(bad & covered), edges), bad & covered))
        data &= ~covered
        bad &= ~covered
    several = False  # explaining by several components: each must be mostly slow itself
    while bad.any() and len(found) < MAX_CAUSES:
        remaining = int(bad.sum())
        h_total = np.bincount(ch_host[data[ch_comm]], minlength=n_hosts).astype(float)
        h_slow = np.bincount(ch_host[bad[ch_comm]], minlength=n_hosts).astype(float)
        e_total = np.bincount(ce_edge[data[ce_comm]], minlength=n_edges).astype(float)
        e_slow = np.bincount(ce_edge[bad[ce_comm]], minlength=n_edges).astype(float)
        with np.errstate(divide="ignore", invalid="ignore"):
            f_host = np.nan_to_num(2 * h_slow / (h_total + remaining))
            f_edge = np.nan_to_num(2 * e_slow / (e_total + remaining))
        if several or found:  # most of a component's own communicators must be slow
            f_host[~(h_slow >= min_fit * h_total) | (h_slow == 0)] = 0.0
            f_edge[~(e_slow >= min_fit * e_total) | (e_slow == 0)] = 0.0
        best = max(float(f_host.max(initial=0.0)), float(f_edge.max(initial=0.0)))
        if not found and not several and best < min_fit:
            several = True  # no single fault explains the frame: try several
            continue
        if best <= 0.0:
            break
        hosts_best = np.flatnonzero(f_host >= best - TOL)
        edge_best = float(f_edge.max(initial=0.0))
        # two NICs that fit alike and no cable as well: two slow NICs (their shared comms and
        # each one's own); a cable between them would fit as well as both
        nic = hosts_best.size >= 1 and edge_best < best - TOL
        if hosts_best.size == 1 and edge_best >= best - TOL:
            # a NIC and a cable fit alike: the host's comms left out of the fit decide. Left
            # out because a rank computes slowly there and still fast: not the NIC. Set aside
            # for an earlier cause: they cannot say, and one cable (the smaller claim) stands;
            # several cables that fit alike, one NIC at their meeting point is the simpler
            h = int(hosts_best[0])
            aside = np.bincount(ch_host[(ev.data & ~data)[ch_comm]], minlength=n_hosts)[h]
            one_cable = int((f_edge >= best - TOL).sum()) == 1
            nic = not (left_n[h] > 0 and 2 * left_ok[h] >= left_n[h]) and not (aside and one_cable)
        covered = np.zeros_like(data)
        if nic:
            h = int(hosts_best[0])
            covered[ch_comm[ch_host == h]] = True
            name = shape.hosts[h]
            entry: LinkSuspect = ((name,), slowdown(bad & covered), ())
            found.append((Subject.host(name), entry, bad & covered))
        else:
            ids = np.flatnonzero(f_edge >= best - TOL)
            if not ids.size:
                break
            # edges that fit alike on the same slow comms are one ambiguous cause; on other
            # comms, another cause (found next)
            first = np.zeros_like(data)
            first[ce_comm[ce_edge == ids[0]]] = True
            same = [e for e in ids.tolist() if (bad & first)[ce_comm[ce_edge == e]].any()]
            ids = np.asarray(same, dtype=np.int64)
            pairs = sorted((int(shape.edges[e, 0]), int(shape.edges[e, 1])) for e in ids)
            names = tuple((shape.hosts[a], shape.hosts[b]) for a, b in pairs)
            hosts = tuple(sorted({h for pair in names for h in pair}))
            covered[ce_comm[np.isin(ce_edge, ids)]] = True
            entry = (hosts, slowdown(bad & covered), names)
            found.append((Subject.link(names), entry, bad & covered))
        data &= ~covered
        bad &= ~covered
    if not found or (n_bad - int(bad.sum())) < min_fit * n_bad:
        return {}
    return {subject: entry for subject, entry, mask in found if matters(mask)}


def crossing(
    shape: JobShape, n: int, hosts: tuple[str, ...], edges: tuple[tuple[str, str], ...]
) -> np.ndarray:
    """The comms (of the first ``n``) that cross a component: a NIC (``hosts``, no ``edges``)
    or any of the cables ``edges``."""
    out = np.zeros(n, dtype=bool)
    if edges:
        edge_of = {(int(a), int(b)): e for e, (a, b) in enumerate(shape.edges.tolist())}
        ids = []
        for a, b in edges:
            if a in shape.hosts and b in shape.hosts:
                i, j = shape.hosts.index(a), shape.hosts.index(b)
                ids.append(edge_of.get((min(i, j), max(i, j)), -1))
        keep = shape.ce_comm < n
        out[shape.ce_comm[keep][np.isin(shape.ce_edge[keep], [e for e in ids if e >= 0])]] = True
    elif hosts and hosts[0] in shape.hosts:
        keep = shape.ch_comm < n
        out[shape.ch_comm[keep][shape.ch_host[keep] == shape.hosts.index(hosts[0])]] = True
    return out
