"""The mitigation pass: decide (policy), persist, execute (actuators), then measure outcomes.

Runs after detection in the service's background loop (and on demand through
``POST /v1/jobs/{job}/evaluate``). Every decision is committed as an action *before* any
actuator runs; execution claims an action with a conditional update, so it happens at most once
even with several service processes or a crash in the middle.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from failslow.detectors.vocab import COMPUTE_KINDS
from failslow.service.actions import outcomes, policy, views
from failslow.service.actions import service as actions
from failslow.service.actions.actuators.registry import build_actuators
from failslow.service.actions.execution import Executor
from failslow.service.actions.models import Action
from failslow.service.actions.settings import ActionsSettings
from failslow.service.actions.vocab import MEASURED, PENDING, ActionKind, ActionState, Approval
from failslow.service.db import session_scope
from failslow.service.incidents import service as incidents
from failslow.service.incidents.models import Incident, IncidentState
from failslow.service.incidents.schemas import IncidentFilter
from failslow.service.metrics import Metrics
from failslow.service.plans import service as plans
from failslow.service.stream.reading import DetectionReader
from failslow.service.stream.registry import JobRegistry
from failslow.service.stream.state import JobState

log = logging.getLogger(__name__)
MANUAL_BY_DEFAULT = (ActionKind.ISOLATE, ActionKind.RESTART, ActionKind.DRAIN,
                     ActionKind.UNDRAIN)  # fmt: skip


class Detection(DetectionReader, Protocol):
    """Detection as mitigation uses it: read through the read interface, and told which
    micro-batch shares a job runs under once it applies a plan."""

    def set_plan_shares(
        self, state: JobState, shares: list[int] | None, *, from_step: int | None = None
    ) -> None: ...


class Mitigation:
    def __init__(
        self,
        *,
        settings: ActionsSettings,
        sessions: sessionmaker[Session],
        metrics: Metrics,
        jobs: JobRegistry,
        detection: Detection,
        clock: Callable[[], int] = time.time_ns,
        muted_of: Callable[[str], str] = lambda _job: "",
    ) -> None:
        """``muted_of(job)``: why the job is muted now ("" when it is not): then nothing is
        proposed for it, not even a notification (runtime control, service/control)."""
        self.muted_of = muted_of
        self.settings = settings
        self.sessions = sessions
        self.metrics = metrics
        self.jobs = jobs
        self.detection = detection
        self.clock = clock
        self.executor = Executor(
            settings=settings,
            sessions=sessions,
            metrics=metrics,
            jobs=jobs,
            detection=detection,
            clock=clock,
        )
        self.actuators = self.executor.actuators = build_actuators(settings, self.executor.publish)
        self._lock = threading.Lock()  # one pass at a time in this process
        self._adopted: dict[str, int] = {}  # job -> plan version the detectors follow
        self.budgets = policy.Budgets(
            costs_s=dict(settings.costs_s),
            max_isolations_per_hour=settings.max_isolations_per_hour,
            min_world_size=settings.min_world_size,
            cooldown_s=settings.cooldown_s,
            act_from=settings.act_from,
            min_gain=settings.min_gain,
        )

    # -- configuration -------------------------------------------------------------------------
    def mode(self, kind: str) -> str:
        default = Approval.MANUAL if kind in MANUAL_BY_DEFAULT else Approval.AUTO
        return self.settings.approval.get(kind, default)

    def actuator_name(self, kind: str) -> str:
        name = self.settings.actuator_for.get(kind, "log")
        return name if name in self.actuators else "log"

    # -- start-up ------------------------------------------------------------------------------
    def recover(self) -> list[str]:
        with session_scope(self.sessions) as s:
            ids = actions.recover_interrupted(s, now_ns=self.clock())
        for _ in ids:
            self.metrics.actions.labels("unknown", ActionState.FAILED).inc()
        if ids:
            log.warning("actions interrupted by the last stop, marked failed: %s", ", ".join(ids))
        return ids

    # -- passes --------------------------------------------------------------------------------
    def run_due(self) -> None:
        if not self.settings.enabled:
            return
        with session_scope(self.sessions) as s:
            jobs = set(
                s.scalars(
                    select(Incident.job_id)
                    .where(Incident.state == IncidentState.OPEN)
                    .distinct()
                )
            )
            jobs |= set(self.detection.jobs_with_shares())
            jobs |= set(
                s.scalars(
                    select(Action.job_id)
                    .where(
                        (Action.state == ActionState.APPROVED)
                        | ((Action.state == ActionState.SUCCEEDED) & Action.outcome.is_(None))
                    )
                    .distinct()
                )
            )
        for job in sorted(jobs):
            try:
                self.run_job(job)
            except Exception:  # noqa: BLE001 - one job's failure must not stop the others
                log.exception("mitigation pass failed for job %s", job)

    def run_job(self, job: str) -> None:
        if not self.settings.enabled:
            return
        with self._lock:
            self._decide(job)
            self.executor.execute_approved(job)
            self._adopt_unacknowledged(job)
            self._measure(job)

    def propose_hint(self, job: str, spec: policy.ActionSpec,
                     event_ns: int) -> tuple[str, str] | None:  # fmt: skip
        """An action decided outside the ladder (the fleet ledger's drain hints, docs/fleet.md),
        under the same approval rules and actuators; ``job``: the job whose evidence decided it.
        Returns ``(action id, state)``; the same ``spec.key`` again returns the first one.
        Approved ones run in the next pass (``run_due``). None while the job is muted: nothing
        is proposed for a muted job, a hint included."""
        if why := self.muted_of(job):
            log.info("no %s %s proposed: job %s is muted (%s)", spec.kind, spec.target, job, why)
            return None
        with session_scope(self.sessions) as s:
            action, created = actions.propose(
                s, job=job, incident=None, spec=spec, mode=self.mode(spec.kind),
                actuator=self.actuator_name(spec.kind), dry_run=self.settings.dry_run,
                now_ns=self.clock(), event_ns=event_ns,
            )  # fmt: skip
            out = (action.id, action.state)
            about = {"training_job": job, "action": action.id, "target": action.target,
                     "incident": "", "reason": action.reason}  # fmt: skip
        if created:
            self.metrics.action(spec.kind, ActionState.PROPOSED, **about)
            if out[1] == ActionState.APPROVED:
                self.metrics.action(spec.kind, ActionState.APPROVED, **about)
            log.info("action %s %s %s (%s): %s", out[0], spec.kind, spec.target, out[1],
                     spec.reason)  # fmt: skip
        return out

    def execute(self, action_id: str) -> str | None:
        """Run one approved action (if this caller wins the claim); returns its final state."""
        return self.executor.execute(action_id)

    def execute_when_ready(self, job: str) -> None:
        """Execute a job's approved actions now (after an operator's approval)."""
        with self._lock:
            self.executor.execute_approved(job)

    # -- plans the job applies -------------------------------------------------------------
    def acknowledged(self, job: str, version: int, step: int) -> None:
        """The job applies plan ``version`` from ``step``: detectors follow from that step."""
        with session_scope(self.sessions) as s:
            row = plans.version(s, job=job, version=version)
            shares = (row.body or {}).get("microbatch_shares") if row is not None else None
        state = self.jobs.get(job)
        if shares and state is not None:
            self.detection.set_plan_shares(state, list(shares), from_step=step)  # type: ignore[arg-type]
            self._adopted[job] = version

    def _adopt_unacknowledged(self, job: str) -> None:
        """A plan with new shares the job never acknowledged is assumed applied after
        ``plan_ack_timeout_s``: comparing compute against shares it no longer runs would
        make its healthy ranks look slow."""
        with session_scope(self.sessions) as s:
            row = plans.newest(s, job=job)
        if row is None:
            return
        version, shares = row.version, (row.body or {}).get("microbatch_shares")
        if not shares or row.applied_step is not None or self._adopted.get(job) == version:
            return
        if self.clock() - row.created_ns < self.settings.plan_ack_timeout_s * 1e9:
            return
        state = self.jobs.get(job)
        if state is None:
            return
        log.warning(
            "job %s did not acknowledge plan v%s within %.0f s; assuming it applies it now",
            job,
            version,
            self.settings.plan_ack_timeout_s,
        )
        self.detection.set_plan_shares(state, list(shares))
        self._adopted[job] = version

    # -- deciding ------------------------------------------------------------------------------
    def job_view(self, job: str, session: Session) -> policy.JobView | None:
        return views.job_view(session, job=job, jobs=self.jobs, detection=self.detection)

    def _decide(self, job: str) -> None:
        with session_scope(self.sessions) as s:
            open_rows = incidents.list_incidents(s, job=job, state=IncidentFilter.OPEN)
            view = self.job_view(job, s)
            if view is None:
                return
            muted = self.muted_of(job)
            if muted:
                why = f"{muted}: detected, neither acted on nor notified"
                for row in open_rows:
                    if row.evidence.get("policy") != why:
                        row.evidence = {**row.evidence, "policy": why}
                return
            self._maybe_restore(s, job, view, open_rows)
            if not open_rows:
                return
            costs, recovered = views.learned(s)  # once per pass; the job's actions per incident
            for row in open_rows:
                past = views.past(actions.list_actions(s, job=job))  # sees this pass's proposals
                hist = policy.History(actions=past, costs=costs, recovered=recovered)
                decision = policy.decide(
                    views.incident_view(row), view, hist, self.budgets, view.watermark_ns
                )
                if not decision.actions:
                    if row.evidence.get("policy") != decision.reason:
                        row.evidence = {**row.evidence, "policy": decision.reason}
                    continue
                for spec in decision.actions:
                    self._propose(s, job, row, spec, view)

    def _maybe_restore(
        self, s: Session, job: str, view: policy.JobView, open_rows: list[Incident]
    ) -> None:
        version, body, _ = plans.current(s, job=job)
        shares = body.get("microbatch_shares")
        if not shares or len(set(shares)) <= 1:
            return
        if any(a.state in PENDING for a in actions.list_actions(s, job=job)):
            return
        state = self.jobs.get(job)
        if state is None:
            return
        decision = policy.decide_restore(
            view,
            views.dp_speeds(state, self.detection, len(shares)),
            shares,
            compute_incident_open=any(r.kind in COMPUTE_KINDS for r in open_rows),
            version=version,
            budgets=self.budgets,
        )
        for spec in decision.actions:
            self._propose(s, job, None, spec, view)

    def _propose(
        self,
        s: Session,
        job: str,
        row: Incident | None,
        spec: policy.ActionSpec,
        view: policy.JobView,
    ) -> None:
        params = {
            **spec.params,
            "job_step_time_s": view.step_time_s,
            "baseline_step_time_s": view.baseline_step_time_s,
            "incident_kind": row.kind if row is not None else None,
            "slowdown": row.slowdown if row is not None else None,
        }
        spec = policy.ActionSpec(spec.kind, spec.target, spec.reason, params, spec.rung, spec.key)
        action, created = actions.propose(
            s,
            job=job,
            incident=row.id if row is not None else None,
            spec=spec,
            mode=self.mode(spec.kind),
            actuator=self.actuator_name(spec.kind),
            dry_run=self.settings.dry_run,
            now_ns=self.clock(),
            event_ns=view.watermark_ns,
        )
        if created:
            about = {"training_job": job, "action": action.id, "target": action.target,
                     "incident": action.incident_id or "", "reason": action.reason}  # fmt: skip
            self.metrics.action(spec.kind, ActionState.PROPOSED, **about)
            if action.state == ActionState.APPROVED:
                self.metrics.action(spec.kind, ActionState.APPROVED, **about)
            log.info(
                "action %s %s %s (%s): %s",
                action.id,
                spec.kind,
                spec.target,
                action.state,
                spec.reason,
            )

    # -- outcomes ------------------------------------------------------------------------------
    def _measure(self, job: str) -> None:
        state = self.jobs.get(job)
        numbers = self.detection.numbers(job)
        if state is None or numbers is None:
            return
        with session_scope(self.sessions) as s:
            rows = [
                a
                for a in actions.list_actions(s, job=job, state=ActionState.SUCCEEDED)
                if a.outcome is None and a.kind in MEASURED and not a.dry_run
            ]
            for a in rows:
                outcome = outcomes.measure(
                    a,
                    watermark_ns=state.watermark_ns,
                    frames=numbers.frames,
                    detection=self.detection,
                    min_steps=self.settings.outcome_steps,
                    timeout_s=self.settings.outcome_timeout_s,
                )
                if outcome is not None:
                    a.outcome = outcome
                    log.info("action %s outcome: %s", a.id, outcome)
