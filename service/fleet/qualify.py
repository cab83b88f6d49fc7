"""Qualification before work (docs/fleet.md): the rules. A short compute check on each host and a
link check between hosts, run by the node agents, each host compared with the fleet's norm, and
what the ledger knows of it: a go / no-go list with reasons, for an operator or a scheduler's
prolog. Where runs are kept (the database, shared by replicas) is :mod:`.qualifications`.

A run gives every host one compute task (a fixed matrix-multiply loop; its seconds) and link
tasks in a ring (host i measures the path to host i+1 with the agents' echo test), so that each
host is in two pairs: a host with a slow NIC or cable makes both its pairs slow, a healthy host
at most one. A host's link speed is the better of its pairs; it is no-go when that is below
``link_ratio`` x the norm (the median of the hosts' link speeds in this run and recent
passing ones), or its compute is above ``compute_ratio`` x the norm. Compute is measured per
device (each GPU on a GPU node, the CPU elsewhere: agents/compute.py) and each measurement is
judged against the norm of its own model only (an A100 is not a slow H100), so a host is no-go
for its one slow GPU, named by index and UUID. Two hosts make one pair: a
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


# what a norm is kept per: the kind and, for compute, the model measured ("" for link checks
# and for compute results of agents that did not name their device)
NormKey = tuple[TaskKind, str]


@dataclass(frozen=True, slots=True)
class Measure:
    """One compute measurement: a GPU's, or a CPU node's."""

    device: str  # "cuda: <model>", "cpu: <model>"; "" unnamed
    seconds: float
    gpu: int | None = None  # the GPU's index on its host
    uuid: str | None = None

    @property
    def what(self) -> str:
        if self.gpu is None:
            return "compute"
        return f"GPU {self.gpu}" + (f" ({self.uuid})" if self.uuid else "") + " compute"


def measures(result: Mapping[str, Any]) -> list[Measure]:
    """A compute task's measurements: each GPU's where it reported them, else the host's."""
    gpus = result.get("gpus")
    if gpus:
        return [Measure(str(g.get("device") or result.get("device") or ""), float(g["seconds"]),
                        int(g["index"]), g.get("uuid")) for g in gpus]  # fmt: skip
    if "seconds" not in result:
        return []
    return [Measure(str(result.get("device") or ""), float(result["seconds"]))]


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
    compute: tuple[Measure, ...] = ()  # what its compute check measured (per GPU on GPUs)
    slow_gpus: tuple[Measure, ...] = ()  # its GPUs over the norm (each a reason)


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
          history: Mapping[NormKey, Sequence[float]]) -> dict[str, HostVerdict]:  # fmt: skip
    """Each host's verdict; ``history``: recent passing measurements per kind and model (the
    norm; the link's under ``(LINK, "")``)."""
    done = [t for t in checks if t.result]
    compute = {t.host: measures(t.result) for t in done  # type: ignore[arg-type]
               if t.kind == TaskKind.COMPUTE and "error" not in t.result}  # type: ignore[operator]
    c_norm = {d: _median(list(history.get((TaskKind.COMPUTE, d), ()))
                         + [m.seconds for ms in compute.values() for m in ms if m.device == d])
              for d in {m.device for ms in compute.values() for m in ms}}  # fmt: skip
    links = [(t.host, str(t.peer), float(t.result["bps"])) for t in done  # type: ignore[index]
             if t.kind == TaskKind.LINK and "bps" in t.result]  # type: ignore[operator]
    best_of = {h: max((bps for a, b, bps in links if h in (a, b)), default=None)
               for h in hosts}  # fmt: skip
    l_norm = _median(list(history.get((TaskKind.LINK, ""), ())) +
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
        ms, slow_gpus = compute.get(h, []), []
        for m in ms:
            norm = c_norm[m.device]
            if norm and m.seconds > norms.compute_ratio * norm:
                if m.gpu is not None:
                    slow_gpus.append(m)
                of = f" ({m.device})" if m.device else ""
                reasons.append(f"{m.what} {m.seconds:.3f} s against the fleet norm{of} "
                               f"{norm:.3f} s ({m.seconds / norm:.2f}x)")  # fmt: skip
        secs = max((m.seconds for m in ms), default=None)  # a host runs at its slowest GPU's pace
        best, slow = best_of[h], None
        if best is not None and l_norm and best < norms.link_ratio * l_norm:
            peers = ", ".join(a if b == h else b for a, b, _ in links if h in (a, b))
            both = " (two hosts: either end may be slow)" if len(hosts) == 2 else ""
            slow = (f"link {best / 1e6:.1f} MB/s at best (to {peers}) against the "
                    f"norm {l_norm / 1e6:.1f} MB/s{both}")  # fmt: skip
            reasons.append(slow)
        out[h] = HostVerdict(Verdict.NO_GO if reasons else Verdict.GO, reasons, secs, best, slow,
                             link_norm=l_norm, link_pairs=sum(h in (a, b) for a, b, _ in links),
                             compute=tuple(ms), slow_gpus=tuple(slow_gpus))
    return out


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


__all__ = ["Check", "HostVerdict", "Measure", "NormKey", "Norms", "RunState", "TaskKind",
           "Verdict", "judge", "measures", "ring"]
