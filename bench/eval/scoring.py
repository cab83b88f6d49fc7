"""Scoring of ``failslow eval``: incidents read back from the service against the simulator's
ground truth (detected, localized, delay, false incidents), the baselines' alarms on the same data,
the CUSUM delay bound, the summary and the table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.eval import baselines, concurrent, patterns, suite

CULPRIT_KINDS = ("slow_gpu", "slow_node", "slow_link")


# -- incidents ------------------------------------------------------------------------------------
def matches(inc: dict[str, Any], fault: dict[str, Any]) -> bool:
    if inc["kind"] != fault["expected_incident"]:
        return False
    kind = fault["kind"]
    if kind in ("slow_gpu", "hang"):
        return list(inc["ranks"]) == list(fault["ranks"])
    if kind in ("slow_node", "slow_nic", "slow_link", "dead_host"):
        return set(inc["hosts"]) == set(fault["hosts"])
    return True  # job_slowdown: no subject


def dated(inc: dict[str, Any], fault: dict[str, Any]) -> bool:
    """The incident's onset is the fault's, within ``concurrent.ONSET_TOLERANCE`` steps (hangs
    have no onset step)."""
    onset = inc.get("onset_step")
    return onset is None or abs(onset - fault["start_step"]) <= concurrent.ONSET_TOLERANCE


@dataclass
class Scored:
    name: str
    family: str
    factor: float | None
    world: int
    steps: int
    seconds: float
    detected: bool = False
    localized: bool = False
    delay_steps: float | None = None
    delay_s: float | None = None
    false_incidents: int = 0
    resolved_after_recovery: bool | None = None
    incidents: list[dict[str, Any]] = field(default_factory=list)
    baselines: dict[str, dict[str, Any]] = field(default_factory=dict)
    bound_steps: float | None = None


def score_case(case: suite.Case, labels: dict[str, Any], incidents: list[dict[str, Any]]) -> Scored:
    sc = case.scenario
    out = Scored(
        case.name,
        case.family,
        case.factor,
        sc.layout.world,
        sc.steps,
        0.0,
        incidents=[
            {k: i[k] for k in ("kind", "ranks", "hosts", "state", "onset_step", "detected_step")}
            for i in incidents
        ],
    )
    if concurrent.is_chronic(case.family):
        concurrent.score_chronic(out, labels, incidents)
        return out
    faults = labels["faults"]
    tolerance_ns = 2_000_000_000
    matched: set[int] = set()
    found: list[tuple[bool, bool]] = []  # per fault: (detected, localized)
    for fault in faults:
        onset = fault["onset_ns"]
        hits = [
            i
            for i in incidents
            if matches(i, fault) and onset is not None and i["detected_ns"] >= onset - tolerance_ns
        ]
        any_kind = [
            i
            for i in incidents
            if i["kind"] == fault["expected_incident"]
            and onset is not None
            and i["detected_ns"] >= onset
        ]
        for i in hits:
            matched.add(id(i))
        if len(faults) > 1:  # concurrent: each placed on its own component at its own onset
            hits = [i for i in hits if dated(i, fault)]
        found.append((bool(hits or any_kind), bool(hits)))
        out.detected, out.localized = all(d for d, _ in found), all(x for _, x in found)
        if hits:
            first = min(hits, key=lambda i: i["detected_ns"])
            out.delay_s = round((first["detected_ns"] - onset) / 1e9, 3)
            if first["detected_step"] is not None:
                out.delay_steps = first["detected_step"] - fault["start_step"]
            elif labels.get("t0_ns") is not None and fault.get("start_step"):
                # a hang has no detected step: its delay in the job's mean step time before it
                step_s = (onset - labels["t0_ns"]) / 1e9 / fault["start_step"]
                out.delay_steps = round(out.delay_s / step_s, 1) if step_s > 0 else None
            if fault.get("end_step") is not None and fault.get("period", 0) == 0:
                end = fault["end_ns"]
                out.resolved_after_recovery = any(
                    i["state"] == "resolved" and end is not None and (i["resolved_ns"] or 0) >= end
                    for i in hits
                )
    out.false_incidents = sum(1 for i in incidents if id(i) not in matched)
    return out


def run_baselines(table: baselines.StepTable, labels: dict[str, Any]) -> dict[str, dict[str, Any]]:
    steps, times = table.job_series()
    ranks, _, compute = table.compute_matrix()
    alarms = {
        "prometheus_rule": baselines.prometheus_rule(steps, times),
        "nvidia_straggler": baselines.nvidia_straggler(ranks, steps, compute),
        "falcon_trigger": baselines.falcon_trigger(steps, times),
    }
    faults = labels["faults"]
    out: dict[str, dict[str, Any]] = {}
    for name, found in alarms.items():
        if not faults:
            out[name] = {
                "detected": False,
                "localized": False,
                "delay_steps": None,
                "false_alarms": len(found),
            }
            continue
        f = faults[0]
        start = f["start_step"]
        culprits = (
            set(f["ranks"])
            if f["kind"] in ("slow_gpu", "hang", "slow_node", "dead_host")
            else set()
        )
        after = [(s, r) for s, r in found if s >= start]
        localized = [(s, r) for s, r in after if r and set(r) == culprits]
        false_alarms = sum(1 for s, r in found if s < start) + sum(
            1 for s, r in after if r and not set(r) <= culprits and culprits
        )
        out[name] = {
            "detected": bool(after),
            "localized": bool(localized),
            "delay_steps": (after[0][0] - start) if after else None,
            "false_alarms": false_alarms,
        }
    return out


def slow_gpu_bound(table: baselines.StepTable, labels: dict[str, Any], arl: float) -> float | None:
    f = labels["faults"][0] if labels["faults"] else None
    if not f or f["kind"] != "slow_gpu":
        return None
    ranks, steps, compute = table.compute_matrix()
    i = int(np.flatnonzero(ranks == f["ranks"][0])[0])
    pre = compute[i, (steps >= 5) & (steps < f["start_step"])]
    pre = pre[np.isfinite(pre)]
    if pre.size < 5:
        return None
    shift = (f["factor"] - 1.0) * float(np.median(pre))
    sigma = 1.4826 * float(np.median(np.abs(pre - np.median(pre))))
    return round(baselines.cusum_delay_bound(shift, sigma, arl), 2)


def summarise(results: list[Scored]) -> dict[str, Any]:
    faults = [r for r in results if r.family not in suite.HEALTHY_FAMILIES]
    strong = [r for r in faults if r.factor is None or r.factor >= 1.2]
    healthy = [r for r in results if r.family in suite.HEALTHY_FAMILIES]
    tp = sum(1 for r in strong if r.localized)
    incidents = sum(len(r.incidents) for r in strong) + sum(r.false_incidents for r in healthy)
    correct = sum(len(r.incidents) - r.false_incidents for r in strong)
    detected = [r for r in faults if r.detected]

    def med(fam: str, factor: float) -> float | None:
        d = [
            r.delay_steps
            for r in faults
            if r.family == "slow_gpu" and r.factor == factor and r.delay_steps is not None
        ]
        return float(np.median(d)) if d else None

    out: dict[str, Any] = {
        "faults": len(faults),
        "faults_ge_1.2x": len(strong),
        "recall_ge_1.2x": round(tp / len(strong), 4) if strong else None,
        "precision_ge_1.2x": round(correct / incidents, 4) if incidents else None,
        "localized_of_detected": round(sum(1 for r in detected if r.localized) / len(detected), 4)
        if detected
        else None,
        "median_delay_steps_1.5x": med("slow_gpu", 1.5),
        "median_delay_steps_1.2x": med("slow_gpu", 1.2),
        "median_delay_steps_1.1x": med("slow_gpu", 1.1),
        "healthy_steps": {r.name: r.steps for r in healthy},
        "healthy_false_incidents": {r.name: r.false_incidents for r in healthy},
    }
    for name in ("prometheus_rule", "nvidia_straggler", "falcon_trigger"):
        det = sum(1 for r in strong if r.baselines[name]["detected"])
        loc = sum(1 for r in strong if r.baselines[name]["localized"])
        fa = sum(r.baselines[name]["false_alarms"] for r in results)
        alarms_total = det + fa
        delays = [
            r.baselines[name]["delay_steps"]
            for r in strong
            if r.baselines[name]["delay_steps"] is not None and r.family == "slow_gpu"
        ]
        out[name] = {
            "recall_detect_ge_1.2x": round(det / len(strong), 4) if strong else None,
            "recall_localized_ge_1.2x": round(loc / len(strong), 4) if strong else None,
            "false_alarms": fa,
            "precision": round(det / alarms_total, 4) if alarms_total else None,
            "median_delay_steps_slow_gpu": float(np.median(delays)) if delays else None,
        }
    ours_delays = [
        r.delay_steps for r in strong if r.family == "slow_gpu" and r.delay_steps is not None
    ]
    out["failslow_median_delay_steps_slow_gpu_ge_1.2x"] = (
        float(np.median(ours_delays)) if ours_delays else None
    )
    out["patterns"] = patterns.summary(results)
    return out


def table_text(results: list[Scored]) -> str:
    head = (
        f"{'scenario':38s} {'world':>5s} {'det':>4s} {'loc':>4s} {'delay':>11s} "
        f"{'FP':>3s} {'res':>4s} "
        f"{'bound':>6s} | {'prom':>5s} {'nvidia':>6s} {'falcon':>6s}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        delay = (
            "-"
            if r.delay_s is None
            else f"{r.delay_steps if r.delay_steps is not None else '?'}st/{r.delay_s:.1f}s"
        )
        res = (
            "-"
            if r.resolved_after_recovery is None
            else ("yes" if r.resolved_after_recovery else "NO")
        )

        def b(name: str, r: Scored = r) -> str:
            x = r.baselines.get(name, {})
            if not x.get("detected"):
                return (
                    "miss"
                    if r.family not in suite.HEALTHY_FAMILIES
                    else f"FA{x.get('false_alarms', 0)}"
                )
            return f"{x['delay_steps']}{'L' if x.get('localized') else ''}"

        lines.append(
            f"{r.name:38s} {r.world:5d} {('yes' if r.detected else 'no'):>4s} "
            f"{('yes' if r.localized else 'no'):>4s} "
            f"{delay:>11s} {r.false_incidents:3d} {res:>4s} "
            f"{('-' if r.bound_steps is None else f'{r.bound_steps:.2f}'):>6s} | "
            f"{b('prometheus_rule'):>5s} {b('nvidia_straggler'):>6s} {b('falcon_trigger'):>6s}"
        )
    return "\n".join(lines)
