"""Executing approved actions: claim (at most once), run the actuator, apply failslow's own
effects (a new plan version, an abandoned restart epoch), record the result."""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from failslow.service.actions import service as actions
from failslow.service.actions.actuators.base import ActionRequest, Actuator, run
from failslow.service.actions.settings import ActionsSettings
from failslow.service.actions.vocab import PENDING, ActionKind, ActionState
from failslow.service.db import session_scope
from failslow.service.incidents import service as incidents
from failslow.service.metrics import Metrics
from failslow.service.plans import service as plans
from failslow.service.stream.reading import DetectionReader
from failslow.service.stream.registry import JobRegistry

log = logging.getLogger(__name__)


class Executor:
    def __init__(
        self,
        *,
        settings: ActionsSettings,
        sessions: sessionmaker[Session],
        metrics: Metrics,
        jobs: JobRegistry,
        detection: DetectionReader,
        clock: Callable[[], int],
    ) -> None:
        self.settings = settings
        self.sessions = sessions
        self.metrics = metrics
        self.jobs = jobs
        self.detection = detection
        self.clock = clock
        self.actuators: dict[str, Actuator] = {}  # set by the owner once built

    def execute_approved(self, job: str) -> None:
        with session_scope(self.sessions) as s:
            approved = [
                a.id for a in actions.list_actions(s, job=job, state=ActionState.APPROVED)
            ]
        for action_id in approved:
            self.execute(action_id)

    def execute(self, action_id: str) -> str | None:
        """Run one approved action (if this caller wins the claim); returns its final state."""
        with session_scope(self.sessions) as s:
            row = actions.get_action(s, action_id=action_id)
            if row is None or row.state != ActionState.APPROVED:
                return None
            if row.kind == ActionKind.RESTART and row.incident_id:
                siblings = actions.list_actions(s, job=row.job_id, incident=row.incident_id)
                if any(a.kind == ActionKind.ISOLATE and a.state in PENDING for a in siblings):
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
        about = {"training_job": request.job, "action": action_id, "target": request.target,
                 "incident": request.incident or ""}  # fmt: skip
        self.metrics.action(request.kind, ActionState.EXECUTING, **about)
        state = self.jobs.get(request.job)
        event_ns = state.watermark_ns if state is not None else 0
        numbers = self.detection.numbers(request.job)
        frames = numbers.frames if numbers is not None else 0
        baseline: dict[str, Any] = {}
        if numbers is not None:
            # the step time the action is up against: recent steps since the fault began
            since = self._onset_step(request.incident)
            during = self.detection.frame_times(request.job, since_step=since, last=10)
            baseline = {
                "exec_step": numbers.step,
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
        self.metrics.action(request.kind, final, **about, result=str(result)[:2000])
        log.info("action %s %s: %s", action_id, final, result)
        return final

    def _onset_step(self, incident_id: str | None) -> int | None:
        if incident_id is None:
            return None
        with session_scope(self.sessions) as s:
            row = incidents.get_incident(s, incident_id=incident_id)
            return row.onset_step if row is not None else None

    def publish(self, request: ActionRequest) -> dict[str, Any]:
        """The plan actuator's effect: the new plan version for a rebalance or re-plan."""
        if request.kind == ActionKind.REBALANCE:
            shares = list(request.params["microbatch_shares"])
            return self._plan_change(request, {"microbatch_shares": shares})
        if request.kind == ActionKind.REPLAN:
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
        if request.kind == ActionKind.ISOLATE:
            host = str(request.params.get("host"))
            ranks = list(request.params.get("ranks", []))
            return self._plan_change(
                request,
                lambda plan: {
                    "excluded_hosts": sorted({*plan["excluded_hosts"], host}),
                    "excluded_ranks": sorted({*plan["excluded_ranks"], *ranks}),
                },
            )
        if request.kind == ActionKind.RESTART:
            out = self._plan_change(
                request, lambda plan: {"restart_epoch": int(plan["restart_epoch"]) + 1}
            )
            if state is not None:
                with state.lock:
                    out["abandoned_collectives"] = state.abandon()
            return out
        return {}
