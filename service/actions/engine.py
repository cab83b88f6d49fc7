"""The mitigation pass: decide (policy), persist, execute (actuators), then measure outcomes.

Runs after detection in the service's background loop (and on demand through
``POST /v1/jobs/{job}/evaluate``). Every decision is committed as an action *before* any
actuator runs; execution claims an action with a conditional update, so it happens at most once
even with several service processes or a crash in the middle.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from failslow.service.actions import outcomes, policy
from failslow.service.actions import service as actions
from failslow.service.actions.actuators.base import ActionRequest, run
from failslow.service.actions.actuators.registry import build_actuators
from failslow.service.actions.models import Action
from failslow.service.db import session_scope
from failslow.service.detection.engine import DetectionEngine
from failslow.service.incidents import service as incidents
from failslow.service.incidents.models import Incident
from failslow.service.jobs.registry import JobRegistry
from failslow.service.metrics import Metrics
from failslow.service.plans import service as plans
from failslow.service.plans.work import dp_index, rings
from failslow.service.settings import ActionsSettings

log = logging.getLogger(__name__)
MANUAL_BY_DEFAULT = ("isolate", "restart")
MEASURED = ("rebalance", "replan", "restart")


def _incident_view(row: Incident) -> policy.IncidentView:
    return policy.IncidentView(
        id=row.id,
        job=row.job_id,
        kind=row.kind,
        state=row.state,
        ranks=tuple(row.ranks),
        hosts=tuple(row.hosts),
        slowdown=row.slowdown,
        subject_slowdown=row.subject_slowdown,
        confidence=row.confidence,
        onset_ns=row.onset_ns,
        detected_ns=row.detected_ns,
        edges=tuple(
            (str(e[0]), str(e[1]))
            for e in (row.evidence.get("candidate_edges") or [])  # type: ignore[union-attr]
            if isinstance(e, list | tuple) and len(e) == 2
        ),
    )


def _past(rows: list[Action]) -> tuple[policy.PastAction, ...]:
    return tuple(
        policy.PastAction(
            r.id, r.incident_id, r.kind, r.target, r.state, r.decided_event_ns, r.decided_event_ns
        )
        for r in rows
    )


class Mitigation:
    def __init__(
        self,
        *,
        settings: ActionsSettings,
        sessions: sessionmaker[Session],
        metrics: Metrics,
        jobs: JobRegistry,
        detection: DetectionEngine,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.settings = settings
        self.sessions = sessions
        self.metrics = metrics
        self.jobs = jobs
        self.detection = detection
        self.clock = clock
        self.actuators = build_actuators(settings, self._publish)
        self._lock = threading.Lock()  # one pass at a time in this process
        self._adopted: dict[str, int] = {}  # job -> plan version the detectors follow
        self.budgets = policy.Budgets(
            costs_s=dict(settings.costs_s),
            max_isolations_per_hour=settings.max_isolations_per_hour,
            min_world_size=settings.min_world_size,
            cooldown_s=settings.cooldown_s,
            notify_below=settings.notify_below,
            min_gain=settings.min_gain,
        )

    # -- configuration -------------------------------------------------------------------------
    def mode(self, kind: str) -> str:
        default = "manual" if kind in MANUAL_BY_DEFAULT else "auto"
        return self.settings.approval.get(kind, default)

    def actuator_name(self, kind: str) -> str:
        name = self.settings.actuator_for.get(kind, "log")
        return name if name in self.actuators else "log"

    # -- start-up ------------------------------------------------------------------------------
    def recover(self) -> list[str]:
        with session_scope(self.sessions) as s:
            ids = actions.recover_interrupted(s, now_ns=self.clock())
        for _ in ids:
            self.metrics.actions.labels("unknown", "failed").inc()
        if ids:
            log.warning("actions interrupted by the last stop, marked failed: %s", ", ".join(ids))
        return ids

    # -- passes --------------------------------------------------------------------------------
    def run_due(self) -> None:
        if not self.settings.enabled:
            return
        with session_scope(self.sessions) as s:
            jobs = set(
                s.scalars(select(Incident.job_id).where(Incident.state == "open").distinct())
            )
            jobs |= set(self.detection.jobs_with_shares())
            jobs |= set(
                s.scalars(
                    select(Action.job_id)
                    .where(
                        (Action.state == "approved")
                        | ((Action.state == "succeeded") & Action.outcome.is_(None))
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
            self._execute(job)
            self._adopt_unacknowledged(job)
            self._measure(job)

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

    def execute_when_ready(self, job: str) -> None:
        """Execute a job's approved actions now (after an operator's approval)."""
        with self._lock:
            self._execute(job)

    # -- deciding ------------------------------------------------------------------------------
    def job_view(self, job: str, session: Session) -> policy.JobView | None:
        state = self.jobs.get(job)
        if state is None:
            return None
        _, plan, _ = plans.current(session, job=job)
        declared = plans.workload(session, job=job)
        with state.lock:
            topo = state.topology
            host_of = {r: i.host for r, i in topo.ranks.items() if i.host is not None}
            dp_of, dp_size = dp_index(topo)
            ring = rings(topo)
            world = topo.world_size or len(topo.ranks)
            watermark = state.watermark_ns
            stale = state.is_stale(time.monotonic())
        for comm, order in plan.get("rank_order", {}).items():
            if comm in ring:
                ring[comm] = tuple(order)
        rt = self.detection.peek(job)
        view = rt.pipeline.job_view() if rt is not None else {}
        return policy.JobView(
            job=job,
            world_size=world,
            host_of=host_of,
            watermark_ns=watermark,
            stale=stale,
            step_time_s=view.get("step_time_s"),  # type: ignore[arg-type]
            baseline_step_time_s=view.get("baseline_step_time_s"),  # type: ignore[arg-type]
            dp_of=dp_of,
            dp_size=dp_size,
            global_batch=declared.global_batch if declared is not None else None,
            rings=ring,
            excluded_hosts=tuple(plan.get("excluded_hosts", ())),
        )

    @staticmethod
    def learned(
        session: Session,
    ) -> tuple[dict[str, float], dict[str, tuple[float, ...]]]:
        """Per action kind, from the newest measured outcomes of every job: the median cost,
        and the recoveries (oldest first)."""
        measured = list(
            session.scalars(
                select(Action)
                .where(Action.outcome.is_not(None), Action.kind.in_(MEASURED))
                .order_by(Action.updated_ns.desc())
                .limit(200)
            )
        )
        costs: dict[str, float] = {}
        recovered: dict[str, tuple[float, ...]] = {}
        for kind in MEASURED:
            mine = [a.outcome for a in measured if a.kind == kind and a.outcome]
            cost = [float(o["cost_s"]) for o in mine[:10] if o.get("cost_s") is not None]
            if cost:
                costs[kind] = statistics.median(cost)
            rec = [float(o["recovered"]) for o in mine[:10] if o.get("recovered") is not None]
            if rec:
                recovered[kind] = tuple(reversed(rec))
        return costs, recovered

    def _decide(self, job: str) -> None:
        with session_scope(self.sessions) as s:
            open_rows = incidents.list_incidents(s, job=job, state="open")
            view = self.job_view(job, s)
            if view is None:
                return
            self._maybe_restore(s, job, view, open_rows)
            if not open_rows:
                return
            costs, recovered = self.learned(s)  # once per pass; the job's actions per incident
            for row in open_rows:
                past = _past(actions.list_actions(s, job=job))  # sees this pass's proposals
                hist = policy.History(actions=past, costs=costs, recovered=recovered)
                decision = policy.decide(
                    _incident_view(row), view, hist, self.budgets, view.watermark_ns
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
        if any(a.state in policy.PENDING for a in actions.list_actions(s, job=job)):
            return
        state = self.jobs.get(job)
        if state is None:
            return
        decision = policy.decide_restore(
            view,
            self.detection.dp_speeds(state, len(shares)),
            shares,
            compute_incident_open=any(r.kind in ("slow_gpu", "slow_node") for r in open_rows),
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
            self.metrics.actions.labels(spec.kind, "proposed").inc()
            if action.state == "approved":
                self.metrics.actions.labels(spec.kind, "approved").inc()
            log.info(
                "action %s %s %s (%s): %s",
                action.id,
                spec.kind,
                spec.target,
                action.state,
                spec.reason,
            )

    # -- executing -----------------------------------------------------------------------------
    def _execute(self, job: str) -> None:
        with session_scope(self.sessions) as s:
            approved = [a.id for a in actions.list_actions(s, job=job, state="approved")]
        for action_id in approved:
            self.execute(action_id)

    def execute(self, action_id: str) -> str | None:
        """Run one approved action (if this caller wins the claim); returns its final state."""
        with session_scope(self.sessions) as s:
            row = actions.get_action(s, action_id=action_id)
            if row is None or row.state != "approved":
                return None
            if row.kind == "restart" and row.incident_id:
                siblings = actions.list_actions(s, job=row.job_id, incident=row.incident_id)
                if any(a.kind == "isolate" and a.state in policy.PENDING for a in siblings):
                    return None  # restart after the isolation(s) it goes with
            if not actions.claim(s, action_id=action_id, now_ns=self.clock()):
                return None
            request = ActionRequest(
                id=row.id,
                job=row.job_id,
                incident=row.incident_id,
                kind=row.kind,
                target=row.target,
                reason=row.reason,
                params=dict(row.params),
                dry_run=row.dry_run,
            )
            actuator_name = row.actuator
        self.metrics.actions.labels(request.kind, "executing").inc()
        state = self.jobs.get(request.job)
        event_ns = state.watermark_ns if state is not None else 0
        rt = self.detection.peek(request.job)
        frames = rt.frames if rt is not None else 0
        baseline: dict[str, Any] = {}
        if rt is not None:
            # the step time the action is up against: recent steps since the fault began
            with rt.lock:
                since = self._onset_step(request.incident)
                during = rt.pipeline.frame_times(since_index=since, last=10)
                baseline = {
                    "exec_step": rt.pipeline.job_view()["step"],
                    "step_time_during_s": round(statistics.median(during), 6) if during else None,
                }
        actuator = self.actuators.get(actuator_name)
        started = time.perf_counter()
        if actuator is None:
            ok, result = False, {"error": f"actuator {actuator_name!r} is not enabled"}
        else:
            outcome = run(actuator, request, timeout_s=self.settings.timeout_s)
            ok, result = outcome.ok, outcome.result
        self.metrics.actuator_seconds.labels(actuator_name).observe(time.perf_counter() - started)
        if ok and not request.dry_run:
            result.update(self._effects(request))
        result.update({"event_ns": event_ns, "frames": frames, **baseline})
        with session_scope(self.sessions) as s:
            row = actions.get_action(s, action_id=action_id)
            assert row is not None
            actions.finish(s, action=row, ok=ok, result=result, now_ns=self.clock())
            final = row.state
        self.metrics.actions.labels(request.kind, final).inc()
        log.info("action %s %s: %s", action_id, final, result)
        return final

    def _onset_step(self, incident_id: str | None) -> int | None:
        if incident_id is None:
            return None
        with session_scope(self.sessions) as s:
            row = incidents.get_incident(s, incident_id=incident_id)
            return row.onset_step if row is not None else None

    def _publish(self, request: ActionRequest) -> dict[str, Any]:
        """The plan actuator's effect: the new plan version for a rebalance or re-plan."""
        if request.kind == "rebalance":
            shares = list(request.params["microbatch_shares"])
            return self._plan_change(request, {"microbatch_shares": shares})
        if request.kind == "replan":
            orders = dict(request.params["rank_order"])
            return self._plan_change(
                request, lambda plan: {"rank_order": {**plan["rank_order"], **orders}}
            )
        return {"published": False, "note": f"a {request.kind} does not change the plan"}

    def _plan_change(self, request: ActionRequest, change: plans.Change) -> dict[str, Any]:
        with session_scope(self.sessions) as s:
            version, created = plans.publish(
                s,
                job=request.job,
                change=change,
                reason=f"{request.kind} ({request.id}): {request.reason}",
                action_id=request.id,
                now_ns=self.clock(),
            )
        if created:
            self.metrics.plans.inc()
        return {"plan_version": version, "published": created}

    def _effects(self, request: ActionRequest) -> dict[str, Any]:
        """What failslow itself does once an action succeeded (whatever its actuator)."""
        state = self.jobs.get(request.job)
        if request.kind == "isolate":
            host = str(request.params.get("host"))
            ranks = list(request.params.get("ranks", []))
            return self._plan_change(
                request,
                lambda plan: {
                    "excluded_hosts": sorted({*plan["excluded_hosts"], host}),
                    "excluded_ranks": sorted({*plan["excluded_ranks"], *ranks}),
                },
            )
        if request.kind == "restart":
            out = self._plan_change(
                request, lambda plan: {"restart_epoch": int(plan["restart_epoch"]) + 1}
            )
            if state is not None:
                with state.lock:
                    out["abandoned_collectives"] = state.assembler.abandon()
            return out
        return {}

    # -- outcomes ------------------------------------------------------------------------------
    def _measure(self, job: str) -> None:
        state = self.jobs.get(job)
        rt = self.detection.peek(job)
        if state is None or rt is None:
            return
        with session_scope(self.sessions) as s:
            rows = [
                a
                for a in actions.list_actions(s, job=job, state="succeeded")
                if a.outcome is None and a.kind in MEASURED and not a.dry_run
            ]
            for a in rows:
                outcome = outcomes.measure(
                    a,
                    watermark_ns=state.watermark_ns,
                    frames=rt.frames,
                    runtime=rt,
                    min_steps=self.settings.outcome_steps,
                    timeout_s=self.settings.outcome_timeout_s,
                )
                if outcome is not None:
                    a.outcome = outcome
                    log.info("action %s outcome: %s", a.id, outcome)
