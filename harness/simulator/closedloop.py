"""The closed loop: a simulated job streams to a real service and follows the plan it publishes.

After every batch of envelopes the driver asks the service to evaluate the job
(``POST /v1/jobs/{job}/evaluate``: detection, then the mitigation policy), lets an optional
operator callback approve or reject proposed actions over REST, polls the plan with
:class:`failslow.agents.plan.PlanClient` and makes the simulation apply a new version at its next
step boundary. Step times are taken from the simulation's own step records (ground truth).
"""

from __future__ import annotations

import gzip
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from failslow.agents.plan import Plan, PlanClient
from failslow.harness.simulator.engine import Simulation
from failslow.harness.simulator.scenario import Scenario

Operator = Callable[[dict[str, Any]], tuple[bool, str] | None]  # action -> (approve?, why)


@dataclass
class LoopResult:
    job: str
    step_time: dict[int, float]  # step -> median duration over ranks (s)
    applied: list[tuple[int, int]] = field(default_factory=list)  # (from step, plan version)
    restarts: list[tuple[float, int]] = field(default_factory=list)
    actions: list[dict[str, Any]] = field(default_factory=list)
    incidents: list[dict[str, Any]] = field(default_factory=list)
    decisions: list[tuple[str, str, bool]] = field(default_factory=list)  # (action, kind, approved)

    def phase(self, lo: int, hi: int) -> float | None:
        vals = [v for s, v in self.step_time.items() if lo <= s < hi]
        return statistics.median(vals) if vals else None

    def recovery(
        self, *, onset: int, end: int, warmup: int = 10, settle: int = 3
    ) -> dict[str, Any]:
        """Step time before the fault, during it (until the first plan applied), and after."""
        first = next((s for s, _ in self.applied if s > onset), None)
        before = self.phase(warmup, onset)
        during = self.phase(onset + 1, first if first is not None else end)
        after = self.phase(first + settle, end) if first is not None else None
        out: dict[str, Any] = {
            "before_s": before,
            "during_s": during,
            "after_s": after,
            "plan_step": first,
        }
        if before and during and after and during > before:
            out["recovered"] = (during - after) / (during - before)
        out["resumed"] = after is not None
        return out


def follow(sim: Simulation, plan: Plan, *, restart_s: float = 30.0) -> int:
    """What a training loop does with a new plan: apply it from its next step boundary
    (returned; acknowledge the plan with it)."""
    return sim.apply_plan(
        version=plan.version,
        shares=plan.microbatch_shares,
        rank_order=plan.rank_order,
        excluded_hosts=plan.excluded_hosts,
        restart_epoch=plan.restart_epoch,
        restart_s=restart_s,
    )


def run(
    scenario: Scenario,
    http: httpx.Client,
    *,
    global_batch: int | None = None,
    restart_s: float = 30.0,
    operator: Operator | None = None,
    ack: bool = True,
) -> LoopResult:
    """Stream ``scenario`` into the service at ``http`` (base URL set) and close the loop.

    ``ack``: acknowledge each plan with the step the simulation applies it from (as
    :meth:`failslow.agents.plan.PlanClient.ack`); without it the service assumes the plan applied
    after its acknowledgement timeout.
    """
    job = scenario.job
    sim = scenario.simulation()
    plans = PlanClient("", job, client=http, global_batch=global_batch)
    steps: dict[int, list[float]] = defaultdict(list)
    result = LoopResult(job=job, step_time={})
    decided: set[str] = set()
    last = Plan()

    def on_batch(s: Simulation, _t: float) -> None:
        nonlocal last
        http.post(f"/v1/jobs/{job}/evaluate").raise_for_status()
        if operator is not None:
            for a in http.get(f"/v1/jobs/{job}/actions", params={"state": "proposed"}).json():
                if a["id"] in decided:
                    continue
                verdict = operator(a)
                if verdict is None:
                    continue
                ok, why = verdict
                verb = "approve" if ok else "reject"
                http.post(
                    f"/v1/actions/{a['id']}/{verb}", json={"reason": why, "actor": "closed-loop"}
                ).raise_for_status()
                decided.add(a["id"])
                result.decisions.append((a["id"], a["kind"], ok))
            http.post(f"/v1/jobs/{job}/evaluate").raise_for_status()
        plan = plans.poll()
        if plan is not None:
            effective = (
                plan.microbatch_shares != last.microbatch_shares
                or plan.rank_order != last.rank_order
                or plan.restart_epoch > last.restart_epoch
            )
            last = plan
            start = follow(s, plan, restart_s=restart_s)
            if effective:  # an isolation alone changes nothing until the restart
                result.applied.append((start, plan.version))
            if ack:
                plans.ack(plan, start)

    for env in scenario.envelopes(sim, on_batch):
        for st in env["steps"]:
            steps[st["step"]].append((st["end_ns"] - st["start_ns"]) / 1e9)
        r = http.post(
            "/v1/ingest",
            content=gzip.compress(orjson.dumps(env), 3),
            headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
        )
        r.raise_for_status()
        if r.json()["rejected"]:
            raise RuntimeError(f"the service rejected records: {r.json()['rejected'][:3]}")
    http.post(f"/v1/jobs/{job}/flush").raise_for_status()
    http.post(f"/v1/jobs/{job}/evaluate").raise_for_status()
    result.step_time = {k: statistics.median(v) for k, v in sorted(steps.items())}
    result.restarts = list(sim.restarts)
    result.actions = http.get(f"/v1/jobs/{job}/actions").json()
    result.incidents = http.get(f"/v1/jobs/{job}/incidents").json()
    return result
