"""The mitigation policy: a pure, cost-aware action ladder in the spirit of FALCON's.

``decide(incident, job, history, budgets, now_ns) -> Decision`` reads only its arguments (time is
passed in, never read) and always says why. The ladder, cheapest rung first:

* ``notify`` once per incident, always (auto);
* ``rebalance`` (compute stragglers: ``slow_gpu``/``slow_node``): new per-data-parallel-rank
  micro-batch shares proportional to measured speed, proposed when they would remove a useful part
  of the slowdown;
* ``replan`` (``slow_link``): a ring order that keeps a slow host pair apart, or that crosses a
  slow NIC fewer times;
* ``isolate`` + ``restart``: for hangs at once, and for slowdowns by the ski-rental rule: act once
  the time already lost to the slowdown reaches the restart's (learned) cost.

Every rung except ``notify`` also waits until the time lost so far reaches that rung's own cost
(ski rental again: a transient slowdown that ends early never pays for an action). Costs start from
configurable defaults and are replaced by what past actions measured (``History.costs``); a rung
whose past outcomes recovered little is skipped. Safety: no action on stale data, at most
``max_isolations_per_hour`` per job, never below ``min_world_size``, a cool-down per target, and
never a second open action of the same kind for one incident (no flapping).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from failslow.service.plans.compute import avoid_edges, group_host, makespan, rebalance_shares

KINDS = ("notify", "rebalance", "replan", "isolate", "restart")
PENDING = ("proposed", "approved", "executing")
HOUR_NS = 3600 * 10**9


@dataclass(frozen=True, slots=True)
class IncidentView:
    id: str
    job: str
    kind: str
    state: str
    ranks: tuple[int, ...]
    hosts: tuple[str, ...]
    slowdown: float | None
    subject_slowdown: float | None
    confidence: float
    onset_ns: int
    detected_ns: int
    # slow_link: the host pairs the detector could not tell apart (one when localised)
    edges: tuple[tuple[str, str], ...] = ()


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
    kind: str
    target: str
    state: str
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
    notify_below: float = 1.05  # job slowdown under which only notify
    min_recovery: float = 0.2  # a rung whose past outcomes recovered less is skipped
    min_gain: float = 0.05  # predicted share of the slowdown an action must remove
    outcomes_needed: int = 3  # past outcomes before ``min_recovery`` applies
    restore_tolerance: float = 0.03  # speeds within this of full count as recovered


@dataclass(frozen=True, slots=True)
class ActionSpec:
    kind: str
    target: str
    reason: str
    params: dict[str, Any] = field(default_factory=dict)
    rung: int = 0  # position on the ladder: part of the idempotency key
    key: str | None = None  # replaces the incident in the idempotency key (no-incident actions)


@dataclass(frozen=True, slots=True)
class Decision:
    actions: tuple[ActionSpec, ...]
    reason: str


def _lost_s(incident: IncidentView, now_ns: int) -> float:
    """Job time lost to the condition so far: all of it for a hang, ``1 - 1/slowdown`` else."""
    elapsed = max(0.0, (now_ns - incident.onset_ns) / 1e9)
    if incident.kind == "hang":
        return elapsed
    slowdown = incident.slowdown or 1.0
    return elapsed * max(0.0, 1.0 - 1.0 / slowdown) if slowdown > 1 else 0.0


def cost_of(kind: str, history: History, budgets: Budgets) -> tuple[float, str]:
    learned = history.costs.get(kind)
    if learned is not None:
        return learned, "learned"
    return float(budgets.costs_s.get(kind, 0.0)), "default"


def _done(history: History, incident: IncidentView, kind: str) -> list[PastAction]:
    return [a for a in history.actions if a.incident == incident.id and a.kind == kind]


def _cooling(history: History, kind: str, target: str, budgets: Budgets, now_ns: int) -> bool:
    for a in history.actions:
        if a.kind == kind and a.target == target and a.state == "succeeded":
            at = a.executed_ns or a.created_ns
            if now_ns - at < budgets.cooldown_s * 1e9:
                return True
    return False


def _poor_record(history: History, kind: str, budgets: Budgets) -> float | None:
    past = history.recovered.get(kind, ())
    if len(past) >= budgets.outcomes_needed:
        recent = sorted(past[-budgets.outcomes_needed :])
        med = recent[len(recent) // 2]
        if med < budgets.min_recovery:
            return med
    return None


# -- the rungs -------------------------------------------------------------------------------------
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


def _isolate(
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
        if a.kind == "isolate"
        and a.state not in ("rejected", "failed")
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
        if _cooling(history, "isolate", f"host:{h}", budgets, now_ns):
            return Decision((), f"host {h} is in its isolation cool-down; {why}")
    specs = [
        ActionSpec(
            "isolate",
            f"host:{h}",
            f"{why}: cordon and drain {h}",
            {"host": h, "ranks": sorted(r for r, x in job.host_of.items() if x == h)},
            rung=3,
        )
        for h in hosts
    ]
    specs.append(
        ActionSpec(
            "restart",
            f"job:{job.job}",
            f"{why}: restart {job.job} from its last checkpoint without {', '.join(hosts)}",
            {"excluded_hosts": list(hosts)},
            rung=4,
        )
    )
    return Decision(tuple(specs), why)


def decide(
    incident: IncidentView,
    job: JobView,
    history: History,
    budgets: Budgets,
    now_ns: int,
) -> Decision:
    """The next action(s) for one incident, with the reason (an empty decision says why not)."""
    if incident.state != "open":
        return Decision((), "the incident is resolved; nothing to do")
    if job.stale:
        return Decision((), "telemetry for the job is stale; no action on stale data")
    pending = [a for a in history.actions if a.incident == incident.id and a.state in PENDING]
    if pending:
        kinds = ", ".join(sorted({f"{a.kind} ({a.state})" for a in pending}))
        return Decision((), f"waiting for {kinds}")
    lost = _lost_s(incident, now_ns)
    if not _done(history, incident, "notify"):
        return Decision(
            (
                ActionSpec(
                    "notify",
                    f"incident:{incident.id}",
                    f"{incident.kind} opened; {lost:.1f} s of job time lost so far",
                    rung=0,
                ),
            ),
            "every incident is announced first",
        )
    if incident.kind == "job_slowdown":
        return Decision((), "a job-wide slowdown has no single culprit: notify only")
    if incident.kind == "hang":
        if _done(history, incident, "isolate") or _done(history, incident, "restart"):
            return Decision((), "isolate/restart already decided for this hang")
        roots = ", ".join(incident.hosts) or "unknown hosts"
        return _isolate(
            incident, job, history, budgets, now_ns, f"the job is hung; root(s) on {roots}"
        )
    slowdown = incident.slowdown or 1.0
    if slowdown < budgets.notify_below:
        return Decision(
            (),
            f"job slowdown {slowdown:.2f}x is below {budgets.notify_below:.2f}x: notify only",
        )
    notes: list[str] = []
    if incident.kind in ("slow_gpu", "slow_node"):
        step = _rung(
            incident, job, history, budgets, now_ns, lost, "rebalance", notes, _rebalance_spec
        )
        if step is not None:
            return step
    elif incident.kind == "slow_link":
        step = _rung(incident, job, history, budgets, now_ns, lost, "replan", notes, _replan_spec)
        if step is not None:
            return step
    if _done(history, incident, "isolate"):
        return Decision((), "; ".join(notes + ["isolation already decided for this incident"]))
    if incident.kind == "slow_link" and len(incident.hosts) != 1:
        why = (
            "a slow host pair is not isolated (which end?)"
            if len(incident.hosts) == 2
            else f"the slow link is one of {len(incident.hosts)} hosts' links: not isolated"
        )
        return Decision((), "; ".join([*notes, why]))
    restart_cost, source = cost_of("restart", history, budgets)
    if lost < restart_cost:
        return Decision(
            (),
            "; ".join(
                notes
                + [
                    f"{lost:.1f} s lost so far < restart cost {restart_cost:.0f} s ({source}): "
                    "not worth a restart yet (ski rental)"
                ]
            ),
        )
    poor = _poor_record(history, "restart", budgets)
    if poor is not None:
        return Decision((), f"past restarts recovered a median {poor:.0%}: not proposed")
    why = (
        f"{lost:.1f} s of job time lost since onset >= restart cost {restart_cost:.0f} s "
        f"({source}; ski rental)"
    )
    return _isolate(incident, job, history, budgets, now_ns, why)


def _rebalance_spec(incident: IncidentView, job: JobView) -> tuple[ActionSpec | None, str]:
    planned = plan_rebalance(incident, job)
    if planned is None:
        return None, "rebalance not possible (no data parallelism or global batch not declared)"
    shares, gain, why = planned
    spec = ActionSpec(
        "rebalance",
        f"job:{job.job}",
        why,
        {"microbatch_shares": shares, "predicted_recovery": round(gain, 3)},
        rung=1,
    )
    return spec, why


def _replan_spec(incident: IncidentView, job: JobView) -> tuple[ActionSpec | None, str]:
    planned = plan_replan(incident, job)
    if planned is None:
        return None, "no ring order avoids the slow link"
    orders, what = planned
    target = "link:" + ("-".join(incident.hosts) if len(incident.hosts) <= 2 else "candidates")
    return ActionSpec(
        "replan", target, f"new ring order {what}", {"rank_order": orders}, rung=2
    ), what


def _rung(
    incident: IncidentView,
    job: JobView,
    history: History,
    budgets: Budgets,
    now_ns: int,
    lost: float,
    kind: str,
    notes: list[str],
    build: Any,
) -> Decision | None:
    """One cheap rung; returns a decision to stop at it, or None to fall through (with a note)."""
    if _done(history, incident, kind):
        notes.append(f"{kind} already done for this incident")
        return None
    poor = _poor_record(history, kind, budgets)
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
    if _cooling(history, kind, spec.target, budgets, now_ns):
        notes.append(f"{kind} of {spec.target} is in its cool-down")
        return None
    cost, source = cost_of(kind, history, budgets)
    if lost < cost:
        return Decision(
            (), f"{kind} planned but {lost:.1f} s lost so far < its cost {cost:.1f} s ({source})"
        )
    return Decision((spec,), f"{lost:.1f} s lost >= {kind} cost {cost:.1f} s ({source}): {why}")


def decide_restore(
    job: JobView,
    speeds: Sequence[float],
    shares: Sequence[int],
    *,
    compute_incident_open: bool,
    version: int,
    budgets: Budgets,
) -> Decision:
    """Undo a rebalance once the straggler is gone: when every data-parallel rank computes at
    full speed again (per unit of work), give them equal shares back. Without this a job would
    keep running lopsided shares for a GPU that has long recovered."""
    if len(set(shares)) <= 1:
        return Decision((), "shares are equal")
    if compute_incident_open:
        return Decision((), "a compute straggler is still open: shares kept")
    if job.stale:
        return Decision((), "telemetry for the job is stale; no action on stale data")
    if len(speeds) != len(shares) or not all(v == v and v > 0 for v in speeds):
        return Decision((), "per-rank speeds are not known yet: shares kept")
    slowest = min(range(len(speeds)), key=lambda i: speeds[i])
    if speeds[slowest] < 1.0 - budgets.restore_tolerance:
        return Decision(
            (),
            f"data-parallel rank {slowest} still computes at {speeds[slowest]:.0%} speed: "
            "shares kept",
        )
    even = rebalance_shares([1.0] * len(shares), sum(shares))
    if list(even) == list(shares):
        return Decision((), "shares are already as even as the batch allows")
    why = (
        f"every data-parallel rank computes at full speed again (slowest {speeds[slowest]:.0%}): "
        f"restoring shares {even} from {list(shares)}"
    )
    spec = ActionSpec(
        "rebalance",
        f"job:{job.job}",
        why,
        {"microbatch_shares": even, "restore": True},
        rung=5,
        key=f"restore-after-v{version}",
    )
    return Decision((spec,), why)
