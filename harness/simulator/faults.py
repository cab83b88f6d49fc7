"""Injectable faults with ground-truth labels."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

KINDS = ("slow_gpu", "slow_node", "slow_nic", "slow_link", "hang", "dead_host", "job_slowdown")
# What a correct detector should report for each injected fault.
EXPECTED_INCIDENT = {
    "slow_gpu": "slow_gpu",
    "slow_node": "slow_node",
    "slow_nic": "slow_link",
    "slow_link": "slow_link",
    "hang": "hang",
    "dead_host": "hang",
    "job_slowdown": "job_slowdown",
}


@dataclass(frozen=True)
class Fault:
    """A fault active from ``start_step`` (inclusive) to ``end_step`` (exclusive, None = forever).

    ``factor`` multiplies compute time (slow_gpu, slow_node, job_slowdown) or divides bandwidth
    (slow_nic, slow_link). ``period`` > 0 makes it intermittent: on for ``period`` steps, off for
    ``period`` steps, starting on.
    """

    kind: str
    start_step: int
    end_step: int | None = None
    factor: float = 1.5
    ranks: tuple[int, ...] = ()
    hosts: tuple[str, ...] = ()
    period: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; one of {KINDS}")
        if self.kind in ("slow_gpu", "hang") and len(self.ranks) != 1:
            raise ValueError(f"{self.kind} needs exactly one rank")
        if self.kind in ("slow_node", "slow_nic", "dead_host") and len(self.hosts) != 1:
            raise ValueError(f"{self.kind} needs exactly one host")
        if self.kind == "slow_link" and len(self.hosts) != 2:
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
