"""The slow-link rules of fusion: which link suspects are new, which open ones are still slow,
and which communicators date a new one. Read by ``conditions.Conditions.links_step``."""

from __future__ import annotations

import numpy as np

from failslow.detectors.findings import OpenCondition
from failslow.detectors.link import LinkScores, explained
from failslow.detectors.localise import LinkSuspect, crossing
from failslow.detectors.straggler import FrameScores
from failslow.detectors.types import JobShape
from failslow.detectors.vocab import COMPUTE_KINDS, IncidentKind, Subject, SubjectKind

Opened = dict[tuple[IncidentKind, Subject], OpenCondition]
KIND = IncidentKind.SLOW_LINK


def open_links(opened: Opened) -> dict[Subject, LinkSuspect]:
    """The NICs and cables of open ``slow_link`` incidents, as link suspects."""
    return {
        subject: (info.hosts, float("nan"), tuple(tuple(e) for e in info.extra.get("edges", [])))
        for (kind, subject), info in opened.items()
        if kind == KIND
    }


def new_suspects(opened: Opened, links: LinkScores, busy: set[str]) -> set[Subject]:
    """Link suspects that nothing open explains: not compute-slow hosts (``busy``), and not an
    open slow NIC (every slow link of its host) or an open slow cable (the NIC of either end;
    its probes tell which): no second incident for one fault (a throttled NIC opened a cable
    and then the NIC in the lab's FSDP2 x TP x PP job)."""
    nics: set[str] = set()
    cabled: set[str] = set()
    for (k, subj), info in opened.items():
        if k == KIND:
            (nics if subj.kind == SubjectKind.HOST else cabled).update(info.hosts)
    return {
        k
        for k, (hosts, _, edges) in links.suspects.items()
        if not explained(busy, hosts, edges)
        and not (k.kind == SubjectKind.LINK and nics.intersection(hosts))
        and not (k.kind == SubjectKind.HOST and cabled.intersection(hosts))
    }


def still_slow(opened: Opened, links: LinkScores, relaxed_ratio: float) -> set[Subject]:
    """Open link subjects whose comms, as a group (the median: with dozens of comms one always
    dips by jitter alone), stay below the relaxed ratio; a comm back inside its own noise counts
    as healthy (small jobs: no peers)."""
    out = set()
    for (k, subject), info in opened.items():
        if k != KIND:
            continue
        ratios = [
            links.ratio[c] if links.beyond_noise[c] else 1.0
            for c in info.extra.get("comms", [])
            if c < links.ratio.size and np.isfinite(links.ratio[c])
        ]
        if ratios and float(np.median(ratios)) < relaxed_ratio:
            out.add(subject)
    return out


def own_comms(
    shape: JobShape, links: LinkScores, subject: Subject, hosts: tuple[str, ...], opened: Opened
) -> list[int]:
    """The slow comms through a new link subject's hosts that date it: not those an open
    incident explains (a second NIC shares the first one's comms between them, slow since the
    first fault began), unless nothing else is left."""
    host_idx = {shape.hosts.index(h) for h in hosts if h in shape.hosts}
    n = links.slow.size
    comms = [c for c in range(n) if links.slow[c] and host_idx & set(shape.comm_hosts[c])]
    theirs = np.zeros(n, dtype=bool)
    for subj, (h2, _, e2) in open_links(opened).items():
        if subj != subject:
            theirs |= crossing(shape, n, h2, e2)
    return [c for c in comms if not theirs[c]] or comms


def compute_hosts(shape: JobShape, opened: Opened, s: FrameScores) -> set[str]:
    """Hosts with a rank that computes slowly now (a suspect this frame, or an open
    ``slow_gpu``/``slow_node``): a starved CPU or GPU also slows the communication it drives
    (gloo reduces on the CPU, NCCL kernels share the SMs), which is no evidence of a link."""
    out: set[str] = set()
    host = shape.host_of_slot
    # a blind job's suspects are only late, which a slow NIC makes them too: no evidence
    suspects = np.flatnonzero(s.suspect[: host.size]) if not s.blind else np.zeros(0, int)
    for slot in suspects.tolist():
        if host[slot] >= 0:
            out.add(shape.hosts[host[slot]])
    for (kind, _), info in opened.items():
        if kind in COMPUTE_KINDS:
            out.update(h for h in info.hosts if h)
    return out
