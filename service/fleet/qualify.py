"""Qualification before work (docs/fleet.md): the rules. A short compute check on each host and a
link check between hosts, run by the node agents, each host compared with the fleet's norm, and
what the ledger knows of it: a go / no-go list with reasons, for an operator or a scheduler's
prolog. Where runs are kept (the database, shared by replicas) is :mod:`.qualifications`.

A run gives every host one compute task (a fixed matrix-multiply loop; its seconds) and link
tasks in a ring (host i measures the path to host i+1 with the agents' echo test), so that each
host is in two pairs: a host with a slow NIC or cable makes both its pairs slow, a healthy host
at most one. A host's link speed is the better of its pairs; it is no-go when that is below
``link_ratio`` x the norm (the median of the hosts' link speeds in this run and recent
passing ones), or its compute is above ``compute_ratio`` x the norm. Two hosts make one pair: a
slow one names both ends (said so). A host already failed or suspect in the ledger, or with a
flagged GPU or NIC, is no-go whatever it measures; one whose agent does not answer within the
timeout is no-go. A host found no-go for its link is handed to the fleet ledger: a mark on its
network part, as a slow-link incident would make.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Verdict(StrEnum):
    GO = "go"
    NO_GO = "no-go"
    PENDING = "pending"


class TaskKind(StrEnum):
    COMPUTE = "compute"
    LINK = "link"


class RunState(StrEnum):
    RUNNING = "running"
    DONE = "done"


@dataclass(frozen=True)
class Norms:
    link_ratio: float = 0.5
    compute_ratio: float = 1.25
    keep: int = 1000  # recent passing measurements per kind kept for the norm


@dataclass(frozen=True, slots=True)
class Check:
    """One check as the rules see it: who ran it, to whom, what it answered (None: nothing)."""

    host: str
    kind: TaskKind
    peer: str | None
    result: Mapping[str, Any] | None


@dataclass(frozen=True, slots=True)
class HostVerdict:
    verdict: Verdict
    reasons: list[str]
    compute_s: float | None
    link_bps: float | None
    slow_link: str | None  # the reason, when it is no-go for its link
    link_norm: float | None = None  # the norm its link was judged against
    link_pairs: int = 0  # its pairs measured (two or more: its link speed is its NIC's)


def ring(hosts: Sequence[str]) -> list[tuple[TaskKind, str, str | None]]:
    """The checks of a run: a compute check per host, link checks to the next host in a ring
    (one pair for two hosts, none for one)."""
    out: list[tuple[TaskKind, str, str | None]] = [(TaskKind.COMPUTE, h, None) for h in hosts]
    if len(hosts) >= 2:
        pairs = [(hosts[i], hosts[(i + 1) % len(hosts)]) for i in range(len(hosts))]
        out += [(TaskKind.LINK, a, b) for a, b in pairs[: 1 if len(hosts) == 2 else None]]
    return out


def judge(hosts: Sequence[str], checks: Sequence[Check], *, seen: set[str],
          standing: Mapping[str, list[str]], norms: Norms,
          history: Mapping[TaskKind, Sequence[float]]) -> dict[str, HostVerdict]:  # fmt: skip
    """Each host's verdict; ``history``: recent passing measurements per kind (the norm)."""
    done = [t for t in checks if t.result]
    compute = {t.host: float(t.result["seconds"]) for t in done  # type: ignore[index]
               if t.kind == TaskKind.COMPUTE and "seconds" in t.result}  # type: ignore[operator]
    links = [(t.host, str(t.peer), float(t.result["bps"])) for t in done  # type: ignore[index]
             if t.kind == TaskKind.LINK and "bps" in t.result]  # type: ignore[operator]
    best_of = {h: max((bps for a, b, bps in links if h in (a, b)), default=None)
               for h in hosts}  # fmt: skip
    c_norm = _median(list(history.get(TaskKind.COMPUTE, ())) + list(compute.values()))
    l_norm = _median(list(history.get(TaskKind.LINK, ())) +
                     [b for b in best_of.values() if b is not None])  # fmt: skip
    out: dict[str, HostVerdict] = {}
    for h in hosts:
        reasons = list(standing.get(h, []))
        for t in (t for t in checks if t.host == h or t.peer == h):
            if t.result is None and t.kind == TaskKind.COMPUTE:
                reasons.append(f"compute check {h}: no answer from the agent in time")
            elif t.result is None and {t.host, str(t.peer)} <= seen:
                reasons.append(f"link check {t.host} -> {t.peer}: no answer in time")
            # (a link check with a silent end is that end's fault: its compute says so)
            elif t.result is not None and "error" in t.result:
                reasons.append(f"{t.kind} check failed: {str(t.result['error'])[:200]}")
        secs = compute.get(h)
        if secs is not None and c_norm and secs > norms.compute_ratio * c_norm:
            reasons.append(f"compute {secs:.3f} s against the fleet norm {c_norm:.3f} s "
                           f"({secs / c_norm:.2f}x)")  # fmt: skip
        best, slow = best_of[h], None
        if best is not None and l_norm and best < norms.link_ratio * l_norm:
            peers = ", ".join(a if b == h else b for a, b, _ in links if h in (a, b))
            both = " (two hosts: either end may be slow)" if len(hosts) == 2 else ""
            slow = (f"link {best / 1e6:.1f} MB/s at best (to {peers}) against the "
                    f"norm {l_norm / 1e6:.1f} MB/s{both}")  # fmt: skip
            reasons.append(slow)
        out[h] = HostVerdict(Verdict.NO_GO if reasons else Verdict.GO, reasons, secs, best, slow,
                             link_norm=l_norm, link_pairs=sum(h in (a, b) for a, b, _ in links))
    return out


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


__all__ = ["Check", "HostVerdict", "Norms", "RunState", "TaskKind", "Verdict", "judge", "ring"]
