"""Hang evidence from the nodes: PyTorch Flight Recorder status and NCCL RAS, merged into the
hang incident.

While a ``hang`` incident is open, every agent of the job is asked once (through its task poll)
to collect what its ranks' Flight Recorders and NCCL's RAS say: per rank and process group its
newest traced collective (sequence number, enqueue time) and last enqueued/started/completed,
and the ranks RAS finds dead, unresponsive, missing or lagging. The service joins the hosts'
reports as PyTorch's ``fr_trace`` analyzer does: in each process group whose members disagree,
the members that never enqueued the newest collective are the ones the rest wait for; the group
whose newest collective was enqueued first is where the job got stuck (``first``), and its
lagging members are the roots. Both land in the incident's evidence (``flight_recorder``,
``nccl_ras``) and in one sentence of its summary; the detectors' later updates keep them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class GroupStatusIn(BaseModel):
    last_seq: int | None = None
    last_created_ns: int | None = None
    last_enqueued: int | None = None
    last_started: int | None = None
    last_completed: int | None = None


class GroupIn(BaseModel):
    desc: str = ""
    ranks: list[int]


class HangEvidenceIn(BaseModel):
    host: str = Field(max_length=128)
    flight_recorder: dict[int, dict[str, GroupStatusIn]] = Field(
        default_factory=dict, description="rank -> process group -> its last collectives"
    )
    groups: dict[str, GroupIn] = Field(
        default_factory=dict, description="process group -> its description and global ranks"
    )
    nccl_ras: dict[int, str] = Field(
        default_factory=dict, description="rank -> dead | unresponsive | missing | lagging"
    )
    errors: list[str] = Field(default_factory=list, max_length=100)


def merge(evidence: dict[str, Any], report: HangEvidenceIn) -> dict[str, Any]:
    """The incident's evidence with one host's report added (pure)."""
    out = dict(evidence)
    fr = dict(out.get("flight_recorder") or {})
    ranks = {int(k): v for k, v in dict(fr.get("ranks") or {}).items()}
    for rank, groups in report.flight_recorder.items():
        ranks[int(rank)] = {g: s.model_dump(exclude_none=True) for g, s in groups.items()}
    groups = dict(fr.get("groups") or {})
    groups.update({g: v.model_dump() for g, v in report.groups.items()})
    hosts = sorted({*fr.get("hosts", []), report.host})
    lagging = _lagging(ranks, groups)
    fr = {
        "ranks": {str(r): v for r, v in sorted(ranks.items())},
        "groups": groups,
        "hosts": hosts,
        "lagging": lagging,
        "errors": [*fr.get("errors", []), *(f"{report.host}: {e}" for e in report.errors)][-50:],
    }
    first = lagging[0] if lagging else None
    fr["first"] = first
    if ranks:
        fr["note"] = (
            f"Flight Recorder: ranks {first['ranks']} never enqueued collective "
            f"#{first['stuck_seq']} of process group {first['group']}"
            + (f" ({first['desc']})" if first["desc"] else "")
            + ", the first one the others got stuck in."
            if first
            else f"Flight Recorder ({len(ranks)} ranks): no process group disagrees."
        )
    out["flight_recorder"] = fr
    if report.nccl_ras:
        ras = dict(out.get("nccl_ras") or {})
        suspects = {
            **dict(ras.get("suspects") or {}),
            **{str(k): v for k, v in report.nccl_ras.items()},
        }
        out["nccl_ras"] = {
            "suspects": suspects,
            "note": "NCCL RAS: "
            + ", ".join(
                f"rank {r} {why}" for r, why in sorted(suspects.items(), key=lambda kv: int(kv[0]))
            )
            + ".",
        }
    return out


def _lagging(
    ranks: dict[int, dict[str, dict[str, int]]], groups: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """Process groups whose reporting members disagree, the one stuck first first: the members
    that never enqueued the group's newest traced collective, dated by its earliest enqueue."""
    per_group: dict[str, dict[int, tuple[int, int]]] = {}
    for rank, gs in ranks.items():
        for g, st in gs.items():
            if "last_seq" in st:
                per_group.setdefault(g, {})[rank] = (
                    int(st["last_seq"]),
                    int(st["last_created_ns"]),
                )
    out = []
    for g, per in per_group.items():
        cfg = groups.get(g) or {}
        members = set(cfg.get("ranks") or per)
        per = {r: v for r, v in per.items() if r in members}
        seqs = {v[0] for v in per.values()}
        if len(seqs) <= 1:
            continue
        top = max(seqs)
        out.append(
            {
                "group": g,
                "desc": cfg.get("desc", ""),
                "ranks": sorted(r for r, v in per.items() if v[0] < top),
                "last_seq": top,
                "stuck_seq": min(v[0] for v in per.values()) + 1,  # the first one not enqueued
                "since_ns": min(v[1] for v in per.values() if v[0] == top),
            }
        )
    return sorted(out, key=lambda x: x["since_ns"])
