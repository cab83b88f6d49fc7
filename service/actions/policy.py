"""The mitigation policy: a pure, cost-aware action ladder in the spirit of FALCON's.

``decide(incident, job, history, budgets, now_ns) -> Decision`` reads only its arguments (time is
passed in, never read) and always says why. The ladder, cheapest rung first:

* ``notify`` once per incident, always (auto); nothing more for an incident whose severity
  (from its measured impact: ``detectors.findings.severity_of``) is below ``act_from``
  (``major``: a job slowdown of 1.05x or more);
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

from collections.abc import Sequence

from failslow.detectors.vocab import COMPUTE_KINDS, IncidentKind
from failslow.service.actions.decisions import (
    ActionSpec,
    Budgets,
    Decision,
    History,
    IncidentView,
    JobView,
    PastAction,
)
from failslow.service.actions.rungs import (
    cost_of,
    done,
    isolate,
    lost_s,
    poor_record,
    rebalance_spec,
    replan_spec,
    rung,
)
from failslow.service.actions.vocab import PENDING, ActionKind
from failslow.service.incidents.models import IncidentState
from failslow.service.plans.compute import rebalance_shares

__all__ = [
    "ActionSpec",
    "Budgets",
    "Decision",
    "History",
    "IncidentView",
    "JobView",
    "PastAction",
    "decide",
    "decide_restore",
]


def decide(
    incident: IncidentView,
    job: JobView,
    history: History,
    budgets: Budgets,
    now_ns: int,
) -> Decision:
    """The next action(s) for one incident, with the reason (an empty decision says why not)."""
    if incident.state != IncidentState.OPEN:
        return Decision((), "the incident is resolved; nothing to do")
    if job.stale:
        return Decision((), "telemetry for the job is stale; no action on stale data")
    pending = [a for a in history.actions if a.incident == incident.id and a.state in PENDING]
    if pending:
        kinds = ", ".join(sorted({f"{a.kind} ({a.state})" for a in pending}))
        return Decision((), f"waiting for {kinds}")
    lost = lost_s(incident, now_ns)
    if not done(history, incident, ActionKind.NOTIFY):
        return Decision(
            (
                ActionSpec(
                    ActionKind.NOTIFY,
                    f"incident:{incident.id}",
                    f"{incident.kind} opened; {lost:.1f} s of job time lost so far",
                    rung=0,
                ),
            ),
            "every incident is announced first",
        )
    if incident.kind == IncidentKind.JOB_SLOWDOWN:
        return Decision((), "a job-wide slowdown has no single culprit: notify only")
    if incident.kind == IncidentKind.HANG:
        if done(history, incident, ActionKind.ISOLATE) or done(
            history, incident, ActionKind.RESTART
        ):
            return Decision((), "isolate/restart already decided for this hang")
        roots = ", ".join(incident.hosts) or "unknown hosts"
        return isolate(
            incident, job, history, budgets, now_ns, f"the job is hung; root(s) on {roots}"
        )
    if incident.severity.rank < budgets.act_from.rank:
        slowdown = f"job slowdown {incident.slowdown:.2f}x" if incident.slowdown else "impact"
        return Decision(
            (),
            f"severity {incident.severity} ({slowdown}); the policy acts from "
            f"{budgets.act_from}: notify only",
        )
    notes: list[str] = []
    if incident.kind in COMPUTE_KINDS:
        kind = ActionKind.REBALANCE
        step = rung(incident, job, history, budgets, now_ns, lost, kind, notes, rebalance_spec)
        if step is not None:
            return step
    elif incident.kind == IncidentKind.SLOW_LINK:
        kind = ActionKind.REPLAN
        step = rung(incident, job, history, budgets, now_ns, lost, kind, notes, replan_spec)
        if step is not None:
            return step
    if done(history, incident, ActionKind.ISOLATE):
        return Decision((), "; ".join(notes + ["isolation already decided for this incident"]))
    if incident.kind == IncidentKind.SLOW_LINK and len(incident.hosts) != 1:
        why = (
            "a slow host pair is not isolated (which end?)"
            if len(incident.hosts) == 2
            else f"the slow link is one of {len(incident.hosts)} hosts' links: not isolated"
        )
        return Decision((), "; ".join([*notes, why]))
    restart_cost, source = cost_of(ActionKind.RESTART, history, budgets)
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
    poor = poor_record(history, ActionKind.RESTART, budgets)
    if poor is not None:
        return Decision((), f"past restarts recovered a median {poor:.0%}: not proposed")
    why = (
        f"{lost:.1f} s of job time lost since onset >= restart cost {restart_cost:.0f} s "
        f"({source}; ski rental)"
    )
    return isolate(incident, job, history, budgets, now_ns, why)


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
        ActionKind.REBALANCE,
        f"job:{job.job}",
        why,
        {"microbatch_shares": even, "restore": True},
        rung=5,
        key=f"restore-after-v{version}",
    )
    return Decision((spec,), why)
