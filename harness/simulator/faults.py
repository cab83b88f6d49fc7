"""Injectable faults with ground-truth labels."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from failslow.detectors.vocab import IncidentKind


class FaultKind(StrEnum):
    """What the simulator can break."""

    SLOW_GPU = "slow_gpu"  # one rank computes ``factor`` x slower
    SLOW_NODE = "slow_node"  # every rank of one host does
    SLOW_NIC = "slow_nic"  # one host's network bandwidth / ``factor``
    SLOW_LINK = "slow_link"  # the cable between two hosts
    HANG = "hang"  # one rank stops inside a collective
    DEAD_HOST = "dead_host"  # one host stops, its agent too
    JOB_SLOWDOWN = "job_slowdown"  # every rank computes slower


KINDS = tuple(FaultKind)
# What a correct detector should report for each injected fault.
EXPECTED_INCIDENT = {
    FaultKind.SLOW_GPU: IncidentKind.SLOW_GPU,
    FaultKind.SLOW_NODE: IncidentKind.SLOW_NODE,
    FaultKind.SLOW_NIC: IncidentKind.SLOW_LINK,
    FaultKind.SLOW_LINK: IncidentKind.SLOW_LINK,
    FaultKind.HANG: IncidentKind.HANG,
    FaultKind.DEAD_HOST: IncidentKind.HANG,
    FaultKind.JOB_SLOWDOWN: IncidentKind.JOB_SLOWDOWN,
}


@dataclass(frozen=True)
class Fault:
    """A fault active from ``start_step`` (inclusive) to ``end_step`` (exclusive, None = forever).

    ``factor`` multiplies compute time (slow_gpu, slow_node, job_slowdown) or divides bandwidth
    (slow_nic, slow_link). ``period`` > 0 makes it intermittent: on for ``period`` steps, off for
    ``period`` steps, starting on.
    """

    kind: FaultKind
    start_step: int
    end_step: int | None = None
    factor: float = 1.5
    ranks: tuple[int, ...] = ()
    hosts: tuple[str, ...] = ()
    period: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(
                f"unknown fault kind {self.kind!r}; one of {', '.join(k.value for k in KINDS)}"
            )
        object.__setattr__(self, "kind", FaultKind(self.kind))
        if self.kind in (FaultKind.SLOW_GPU, FaultKind.HANG) and len(self.ranks) != 1:
            raise ValueError(f"{self.kind} needs exactly one rank")
        one_host = (FaultKind.SLOW_NODE, FaultKind.SLOW_NIC, FaultKind.DEAD_HOST)
        if self.kind in one_host and len(self.hosts) != 1:
            raise ValueError(f"{self.kind} needs exactly one host")
        if self.kind == FaultKind.SLOW_LINK and len(self.hosts) != 2:
            raise ValueError("slow_link needs two hosts")
        if self.factor <= 0:
            raise ValueError("factor must be > 0")

    def active(self, step: int) -> bool:
        if step < self.start_step or (self.end_step is not None and step >= self.end_step):
            return False
        if self.period > 0:
            return ((step - self.start_step) // self.period) % 2 == 0
        return True

    def label(self) -> dict[str, Any]:
        d = asdict(self)
        d["ranks"] = list(self.ranks)
        d["hosts"] = list(self.hosts)
        d["expected_incident"] = EXPECTED_INCIDENT[self.kind]
        return d
