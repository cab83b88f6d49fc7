"""The values the mitigation policy decides on and with (all frozen: decisions are pure)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from failslow.detectors.vocab import IncidentKind, Severity
from failslow.service.actions.vocab import ActionKind, ActionState
from failslow.service.incidents.models import IncidentState


@dataclass(frozen=True, slots=True)
class IncidentView:
    id: str
    job: str
    kind: IncidentKind
    state: IncidentState
    ranks: tuple[int, ...]
    hosts: tuple[str, ...]
    slowdown: float | None
    subject_slowdown: float | None
    confidence: float
    onset_ns: int
    detected_ns: int
    # slow_link: the host pairs the detector could not tell apart (one when localised)
    edges: tuple[tuple[str, str], ...] = ()
    severity: Severity = Severity.MAJOR  # the incident's cost to the job now


@dataclass(frozen=True, slots=True)
class JobView:
    """What the policy knows about the job (built from topology, detector state and the plan)."""

    job: str
    world_size: int
    host_of: Mapping[int, str]  # rank -> host
    watermark_ns: int
    stale: bool
    step_time_s: float | None
    baseline_step_time_s: float | None
    dp_of: Mapping[int, int] = field(default_factory=dict)  # rank -> data-parallel index
    dp_size: int = 0
    global_batch: int | None = None  # micro-batches per step over all data-parallel ranks
    rings: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # comm -> current order
    excluded_hosts: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PastAction:
    id: str
    incident: str | None
    kind: ActionKind
    target: str
    state: ActionState
    created_ns: int
    executed_ns: int | None = None


@dataclass(frozen=True, slots=True)
class History:
    actions: tuple[PastAction, ...] = ()  # this job's actions, any incident
    costs: Mapping[str, float] = field(default_factory=dict)  # learned cost per kind, seconds
    recovered: Mapping[str, tuple[float, ...]] = field(default_factory=dict)  # past outcomes


@dataclass(frozen=True, slots=True)
class Budgets:
    costs_s: Mapping[str, float]  # default cost per action kind (seconds of job time)
    max_isolations_per_hour: int = 2
    min_world_size: int = 1
    cooldown_s: float = 600.0
    act_from: Severity = Severity.MAJOR  # less severe incidents are only notified
    min_recovery: float = 0.2  # a rung whose past outcomes recovered less is skipped
    min_gain: float = 0.05  # predicted share of the slowdown an action must remove
    outcomes_needed: int = 3  # past outcomes before ``min_recovery`` applies
    # Speeds within this of full count as recovered once no compute incident is open (the
    # detector's own verdict, with hysteresis, comes first). Not tighter: per-step costs that do
    # not shrink with a smaller share (optimizer, launches) make a healthy rank with 5 of 8
    # micro-batches look ~5% slower per unit of work (measured in the demo: 94-95%), which kept
    # lopsided shares for good at 3% (issue 16).
    restore_tolerance: float = 0.08


@dataclass(frozen=True, slots=True)
class ActionSpec:
    kind: ActionKind
    target: str
    reason: str
    params: dict[str, Any] = field(default_factory=dict)
    rung: int = 0  # position on the ladder: part of the idempotency key
    key: str | None = None  # replaces the incident in the idempotency key (no-incident actions)


@dataclass(frozen=True, slots=True)
class Decision:
    actions: tuple[ActionSpec, ...]
    reason: str
