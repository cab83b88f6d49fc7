"""What a lab run reports: per fault, what was found and how fast; every other incident."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from failslow.detectors.vocab import IncidentKind


class LabFault(StrEnum):
    """What the lab injects into a real rank."""

    COMPUTE = "compute"  # a cgroup cpu quota
    LINK = "link"  # tc tbf on its veth
    HANG = "hang"  # SIGSTOP
    SLOW = "slow"  # compute of a known factor (harness/lab/slowdown.py)


FAULTS = (LabFault.COMPUTE, LabFault.LINK, LabFault.HANG)  # --fault all
EXPECTED = {
    LabFault.COMPUTE: IncidentKind.SLOW_GPU,
    LabFault.SLOW: IncidentKind.SLOW_GPU,
    LabFault.LINK: IncidentKind.SLOW_LINK,
    LabFault.HANG: IncidentKind.HANG,
}
LOCALIZED_KINDS = (
    IncidentKind.SLOW_GPU,
    IncidentKind.SLOW_NODE,
    IncidentKind.SLOW_LINK,
    IncidentKind.HANG,
)


@dataclass
class FaultResult:
    fault: str
    target_rank: int
    target_host: str
    injected_step: int
    injected_ns: int
    detected: bool = False
    localized: bool = False
    incident: str | None = None
    kind: str | None = None
    ranks: list[int] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    delay_steps: float | None = None
    delay_s: float | None = None
    summary: str | None = None
    probes: str | None = None  # a link fault: what the active probes concluded (component)
    recovered_step: int | None = None
    resolved: bool = False
    resolve_s: float | None = None
    injected_slowdown: float | None = None  # --fault slow: the true compute factor
    reported_slowdown: float | None = None  # the incident's subject_slowdown


def table(out: dict[str, Any]) -> str:
    rows = [("fault", "target", "found", "incident", "subject", "delay", "resolved")]
    for f in out["faults"]:
        subject = (
            ",".join(f["hosts"])
            if f["kind"] == IncidentKind.SLOW_LINK
            else ",".join(map(str, f["ranks"]))
        )
        delay = f"{f['delay_steps']} st / {f['delay_s']} s" if f["detected"] else "-"
        if f.get("injected_slowdown"):
            subject += f" ({f['reported_slowdown']}x for {f['injected_slowdown']}x)"
        resolved = f"yes ({f['resolve_s']} s)" if f["resolved"] else "no"
        rows.append(
            (f["fault"], f"rank {f['target_rank']}", "yes" if f["detected"] else "NO",
             f["kind"] or "-", subject or "-", delay, resolved)
        )  # fmt: skip
    widths = [max(len(str(r[c])) for r in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    lines.append(
        f"false GPU/node/link/hang incidents: {len(out['false_incidents'])}; "
        f"job_slowdown incidents: {out['job_slowdown_incidents']}; "
        f"healthy step {out['step_time_s'] * 1000:.0f} ms; "
        f"{'PASS' if out['ok'] else 'FAIL'}"
    )
    for f in out["false_incidents"]:
        lines.append(f"  false: {f['kind']} ranks={f['ranks']} hosts={f['hosts']}: {f['summary']}")
    return "\n".join(lines)
