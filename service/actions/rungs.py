"""The rungs of the ladder above ``notify``: what a rebalance, a re-plan or an isolation would
be for an incident, and whether it is worth it now (pure functions of their arguments)."""

from __future__ import annotations

from typing import Any

from failslow.detectors.impact import job_time_lost
from failslow.detectors.vocab import IncidentKind
from failslow.service.actions.decisions import (
    ActionSpec,
    Budgets,
    Decision,
    History,
    IncidentView,
    JobView,
    PastAction,
)
from failslow.service.actions.vocab import ActionKind, ActionState
from failslow.service.plans.compute import avoid_edges, group_host, makespan, rebalance_shares

HOUR_NS = 3600 * 10**9


def lost_s(incident: IncidentView, now_ns: int) -> float:
    """Job time lost to the condition so far: all of it for a hang, ``1 - 1/slowdown`` else."""
    return job_time_lost((now_ns - incident.onset_ns) / 1e9, incident.slowdown,
                         hang=incident.kind == IncidentKind.HANG)  # fmt: skip


def cost_of(kind: ActionKind, history: History, budgets: Budgets) -> tuple[float, str]:
    learned = history.costs.get(kind)
    if learned is not None:
        return learned, "learned"
    return float(budgets.costs_s.get(kind, 0.0)), "default"


def done(history: History, incident: IncidentView, kind: ActionKind) -> list[PastAction]:
    return [a for a in history.actions if a.incident == incident.id and a.kind == kind]


def cooling(history: History, kind: ActionKind, target: str, budgets: Budgets, now_ns: int) -> bool:
    for a in history.actions:
        if a.kind == kind and a.target == target and a.state == ActionState.SUCCEEDED:
            at = a.executed_ns or a.created_ns
            if now_ns - at < budgets.cooldown_s * 1e9:
                return True
    return False


def poor_record(history: History, kind: ActionKind, budgets: Budgets) -> float | None:
    past = history.recovered.get(kind, ())
    if len(past) >= budgets.outcomes_needed:
        recent = sorted(past[-budgets.outcomes_needed :])
        med = recent[len(recent) // 2]
        if med < budgets.min_recovery:
            return med
    return None


def plan_rebalance(incident: IncidentView, job: JobView) -> tuple[list[int], float, str] | None:
    """New shares and the predicted share of the slowdown they remove, or None with no DP."""
    if job.dp_size < 2 or not job.global_batch or job.global_batch < job.dp_size:
        return None
    slow = incident.subject_slowdown or incident.slowdown or 1.0
    if slow <= 1.0:
        return None
    speeds = [1.0] * job.dp_size
    hit = {job.dp_of[r] for r in incident.ranks if r in job.dp_of}
    if not hit:
        return None
    for d in hit:
        speeds[d] = 1.0 / slow
    total = job.global_batch
    even = rebalance_shares([1.0] * job.dp_size, total)
    before = makespan(even, [1.0] * job.dp_size)
    during = makespan(even, speeds)
    shares = rebalance_shares(speeds, total)
    after = makespan(shares, speeds)
    gain = (during - after) / (during - before) if during > before else 0.0
    why = (
        f"data-parallel rank(s) {sorted(hit)} run at {1 / slow:.0%} speed; shares {shares} "
        f"(sum {total}) cut the compute makespan from {during:.2f} to {after:.2f} units "
        f"(fault-free {before:.2f}): {gain:.0%} of the slowdown removed"
    )
    return shares, gain, why


def plan_replan(incident: IncidentView, job: JobView) -> tuple[dict[str, list[int]], str] | None:
    orders: dict[str, list[int]] = {}
    if len(incident.hosts) == 1:
        # one slow NIC: every ring through the host crosses it; only fewer crossings help
        host = incident.hosts[0]
        for comm, order in job.rings.items():
            new = group_host(order, job.host_of, host)
            if new is not None:
                orders[comm] = new
        what = f"makes {len(orders)} ring(s) cross {host}'s NIC only twice (in and out)"
        return (orders, what) if orders else None
    edges = list(incident.edges)
    if not edges and len(incident.hosts) == 2:
        edges = [(incident.hosts[0], incident.hosts[1])]
    if not edges:
        return None
    for comm, order in job.rings.items():
        new = avoid_edges(order, job.host_of, edges)
        if new is not None:
            orders[comm] = new
    pairs = ", ".join(f"{a}-{b}" for a, b in edges)
    what = (
        f"keeps {pairs} out of adjacent ring positions in {len(orders)} comm(s)"
        if len(edges) == 1
        else f"avoids all {len(edges)} candidate links ({pairs}) in {len(orders)} comm(s)"
    )
    return (orders, what) if orders else None


def isolate(
    incident: IncidentView,
    job: JobView,
    history: History,
    budgets: Budgets,
    now_ns: int,
    why: str,
) -> Decision:
    hosts = tuple(h for h in incident.hosts if h not in job.excluded_hosts)
    if not hosts:
        return Decision((), "the culprit host(s) are already excluded; waiting for the restart")
    recent = [
        a
        for a in history.actions
        if a.kind == ActionKind.ISOLATE
        and a.state not in (ActionState.REJECTED, ActionState.FAILED)
        and now_ns - a.created_ns < HOUR_NS
    ]
    if len(recent) + len(hosts) > budgets.max_isolations_per_hour:
        return Decision(
            (),
            f"isolation budget spent: {len(recent)} isolation(s) in the last hour "
            f"(max {budgets.max_isolations_per_hour}); {why}",
        )
    removed = sum(1 for r, h in job.host_of.items() if h in hosts)
    if job.world_size - removed < budgets.min_world_size:
        return Decision(
            (),
            f"isolating {', '.join(hosts)} would leave {job.world_size - removed} ranks, below "
            f"the minimum world size {budgets.min_world_size}; {why}",
        )
    for h in hosts:
        if cooling(history, ActionKind.ISOLATE, f"host:{h}", budgets, now_ns):
            return Decision((), f"host {h} is in its isolation cool-down; {why}")
    specs = [
        ActionSpec(
            ActionKind.ISOLATE,
            f"host:{h}",
            f"{why}: cordon and drain {h}",
            {"host": h, "ranks": sorted(r for r, x in job.host_of.items() if x == h)},
            rung=3,
        )
        for h in hosts
    ]
    specs.append(
        ActionSpec(
            ActionKind.RESTART,
            f"job:{job.job}",
            f"{why}: restart {job.job} from its last checkpoint without {', '.join(hosts)}",
            {"excluded_hosts": list(hosts)},
            rung=4,
        )
    )
    return Decision(tuple(specs), why)


def rebalance_spec(incident: IncidentView, job: JobView) -> tuple[ActionSpec | None, str]:
    planned = plan_rebalance(incident, job)
    if planned is None:
        return None, "rebalance not possible (no data parallelism or global batch not declared)"
    shares, gain, why = planned
    spec = ActionSpec(
        ActionKind.REBALANCE,
        f"job:{job.job}",
        why,
        {"microbatch_shares": shares, "predicted_recovery": round(gain, 3)},
        rung=1,
    )
    return spec, why


def replan_spec(incident: IncidentView, job: JobView) -> tuple[ActionSpec | None, str]:
    planned = plan_replan(incident, job)
    if planned is None:
        return None, "no ring order avoids the slow link"
    orders, what = planned
    target = "link:" + ("-".join(incident.hosts) if len(incident.hosts) <= 2 else "candidates")
    return ActionSpec(
        ActionKind.REPLAN, target, f"new ring order {what}", {"rank_order": orders}, rung=2
    ), what


def rung(
    incident: IncidentView,
    job: JobView,
    history: History,
    budgets: Budgets,
    now_ns: int,
    lost: float,
    kind: ActionKind,
    notes: list[str],
    build: Any,
) -> Decision | None:
    """One cheap rung; returns a decision to stop at it, or None to fall through (with a note)."""
    if done(history, incident, kind):
        notes.append(f"{kind} already done for this incident")
        return None
    poor = poor_record(history, kind, budgets)
    if poor is not None:
        notes.append(f"past {kind} actions recovered a median {poor:.0%}")
        return None
    spec, why = build(incident, job)
    if spec is None:
        notes.append(why)
        return None
    gain = spec.params.get("predicted_recovery")
    if gain is not None and gain < budgets.min_gain:
        notes.append(f"{kind} would remove only {gain:.0%} of the slowdown")
        return None
    if cooling(history, kind, spec.target, budgets, now_ns):
        notes.append(f"{kind} of {spec.target} is in its cool-down")
        return None
    cost, source = cost_of(kind, history, budgets)
    if lost < cost:
        return Decision(
            (), f"{kind} planned but {lost:.1f} s lost so far < its cost {cost:.1f} s ({source})"
        )
    return Decision((spec,), f"{lost:.1f} s lost >= {kind} cost {cost:.1f} s ({source}): {why}")
