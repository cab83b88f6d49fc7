"""One-sentence summaries of incidents, per kind, for people."""

from __future__ import annotations

import time

from failslow.detectors.findings import Finding
from failslow.detectors.vocab import IncidentKind


def _who(rank: int, info: dict[int, tuple[str | None, int | None]]) -> str:
    host, gpu = info.get(rank, (None, None))
    where = host or "an unknown host"
    return f"GPU {gpu} on {where} (rank {rank})" if gpu is not None else f"rank {rank} on {where}"


def _since(f: Finding) -> str:
    if f.evidence.get("chronic"):
        began = f" (step {f.onset_index})" if f.onset_index is not None else ""
        return f"since the job began{began}"
    if f.onset_index is not None:
        return f"since step {f.onset_index}"
    return "since " + time.strftime("%H:%M:%S UTC", time.gmtime(f.onset_ns / 1e9))


def _job(f: Finding) -> str:
    return f"; job step time {(f.slowdown - 1) * 100:+.0f}%" if f.slowdown is not None else ""


def _cost(f: Finding) -> str:
    """What the culprit adds to the job's step time (its critical-path share), else the job's
    slowdown against its baseline."""
    cost = f.evidence.get("attributed_slowdown")
    if cost is None:
        return _job(f)
    return f"; it adds {(cost - 1) * 100:.0f}% to the job's step time"


def _pct(x: float | None) -> str:
    return f"{(x - 1) * 100:.0f}% slower" if x else "slower"


def summary_for(
    f: Finding, ranks: list[int], hosts: list[str], info: dict[int, tuple[str | None, int | None]]
) -> str:
    if f.kind == IncidentKind.SLOW_GPU:
        who = _who(ranks[0], info) if ranks else "a rank"
        lead = f"{who[0].upper()}{who[1:]} is {_pct(f.subject_slowdown)} than its peers"
        # passive data cannot tell its GPU from its host's NIC (detectors/report.py)
        alt = (
            f", or the network link of {hosts[0]} is slow (passive data cannot tell which: it"
            " computes no slower than its role peers)"
            if f.evidence.get("ambiguous") and hosts
            else ""
        )
        text = f"{lead} {_since(f)}{alt}{_cost(f)}."
    elif f.kind == IncidentKind.SLOW_NODE:
        text = (
            f"{hosts[0]} is slow: its {len(ranks)} GPUs compute {_pct(f.subject_slowdown)} "
            "than the same ranks "
            f"on other hosts {_since(f)}{_cost(f)}."
        )
    elif f.kind == IncidentKind.SLOW_LINK:
        edges = f.evidence.get("candidate_edges") or []
        if len(hosts) == 1:
            where = f"The network link of {hosts[0]} is slow"
        elif len(edges) == 1:
            where = f"The link between {hosts[0]} and {hosts[1]} is slow"
        else:
            where = (
                f"One of {len(edges)} ring links among {', '.join(hosts)} is slow"
                " (passive data cannot tell which)"
            )
        factor = f"{f.subject_slowdown:.1f}x" if f.subject_slowdown else "several times"
        text = f"{where}: communicators crossing it move data {factor} slower {_since(f)}{_job(f)}."
    elif f.kind == IncidentKind.HANG:
        if ranks:
            roots = ", ".join(_who(r, info) for r in ranks[:4]) + (
                f" and {len(ranks) - 4} more" if len(ranks) > 4 else ""
            )
            text = f"Job hung {_since(f)}: the others wait for {roots}."
        else:
            text = f"Job hung {_since(f)}: no collective completes; the root could not be named."
    else:
        text = (
            f"The whole job is {_pct(f.subject_slowdown)} {_since(f)} with no GPU, node or"
            f" link to blame{_job(f)}."
        )
    return text
