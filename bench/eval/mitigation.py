"""``failslow eval --mitigation``: closed-loop scenarios through a real service process.

Each simulated job streams into ``failslow serve`` and follows the plan it publishes
(:mod:`failslow.harness.simulator.closedloop`); an operator callback approves manual actions.
Reported per scenario: the actions taken, the job's step time before the fault, during it and after
the first applied plan (ground truth from the simulation), the share of the slowdown recovered,
how long after onset the mitigation took effect, and the outcome the service measured itself.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from failslow.harness.simulator import Fault, Layout, Scenario, closedloop
from failslow.harness.simulator.model import Workload

ROOT = Path(__file__).resolve().parents[2]
ONSET = 40
STEPS = 160
# Costs for these short runs (the defaults assume hours-long jobs: restart 600 s).
ENV = {
    "FAILSLOW_ACTIONS__COSTS_S": json.dumps(
        {"notify": 0, "rebalance": 5, "replan": 5, "isolate": 0, "restart": 20}
    ),
}


@dataclass(frozen=True)
class MitigationCase:
    name: str
    scenario: Scenario
    expect: str  # the action kind that should mitigate
    global_batch: int | None = None
    operator: Callable[[dict[str, Any]], tuple[bool, str] | None] | None = None
    restart_s: float = 20.0


def approve_all(action: dict[str, Any]) -> tuple[bool, str]:
    return True, "approved by the evaluation's operator"


def cases() -> list[MitigationCase]:
    compute = Layout(tp=2, pp=2, dp=4, gpus_per_host=2)  # 16 ranks, 8 hosts, 4 replicas
    ring = Layout(tp=2, pp=1, dp=8, gpus_per_host=2)  # data-parallel rings across 8 hosts
    heavy_dp = Workload(microbatches=4, dp_bytes=1 << 30)
    out = []
    for factor in (1.2, 1.5, 3.0):
        out.append(
            MitigationCase(
                f"slow-gpu-{factor}x",
                Scenario(
                    job=f"mit-gpu-{factor}",
                    layout=compute,
                    steps=STEPS,
                    workload=Workload(microbatches=16),
                    faults=(Fault("slow_gpu", ONSET, factor=factor, ranks=(5,)),),
                    seed=1,
                ),
                "rebalance",
                global_batch=64,
            )
        )
    out.append(
        MitigationCase(
            "slow-node-1.5x",
            Scenario(
                job="mit-node",
                layout=compute,
                steps=STEPS,
                workload=Workload(microbatches=16),
                faults=(Fault("slow_node", ONSET, factor=1.5, hosts=("node-002",)),),
                seed=1,
            ),
            "rebalance",
            global_batch=64,
        )
    )
    out.append(
        MitigationCase(
            "slow-link-pair-4x",
            Scenario(
                job="mit-link",
                layout=ring,
                steps=STEPS,
                workload=heavy_dp,
                faults=(Fault("slow_link", ONSET, factor=4.0, hosts=("node-002", "node-003")),),
                seed=1,
            ),
            "replan",
        )
    )
    out.append(
        MitigationCase(
            "slow-nic-4x-ski-rental",
            Scenario(
                job="mit-nic",
                layout=compute,  # pipeline pairs pin a NIC down (a single ring cannot)
                steps=420,
                workload=heavy_dp,
                faults=(Fault("slow_nic", ONSET, factor=4.0, hosts=("node-005",)),),
                seed=1,
            ),
            "restart",
            operator=approve_all,
        )
    )
    out.append(
        MitigationCase(
            "hang-stuck-rank",
            Scenario(
                job="mit-hang",
                layout=compute,
                steps=STEPS,
                workload=Workload(microbatches=4),
                faults=(Fault("hang", ONSET, ranks=(5,)),),
                seed=1,
                hang_tail_s=120,
            ),
            "restart",
            operator=approve_all,
        )
    )
    return out


def run_case(http: httpx.Client, case: MitigationCase) -> dict[str, Any]:
    started = time.monotonic()
    res = closedloop.run(
        case.scenario,
        http,
        global_batch=case.global_batch,
        operator=case.operator,
        restart_s=case.restart_s,
    )
    end = max(res.step_time) + 1 if res.step_time else case.scenario.steps
    rec = res.recovery(onset=ONSET, end=end)
    acted = [a for a in res.actions if a["kind"] == case.expect and a["state"] == "succeeded"]
    row: dict[str, Any] = {
        "name": case.name,
        "expected": case.expect,
        "actions": [f"{a['kind']}:{a['state']}" for a in res.actions],
        "mitigated": bool(acted),
        "plan_step": rec["plan_step"],
        "steps_to_mitigation": (rec["plan_step"] - ONSET) if rec["plan_step"] else None,
        "before_s": rec["before_s"],
        "during_s": rec["during_s"],
        "after_s": rec["after_s"],
        "recovered": rec.get("recovered"),
        "resumed": rec["resumed"],
        "service_outcome": acted[0]["outcome"] if acted else None,
        "reason": acted[0]["reason"] if acted else None,
        "restarts": res.restarts,
        "incidents": [f"{i['kind']}:{i['state']}" for i in res.incidents],
        "seconds": round(time.monotonic() - started, 1),
    }
    return row


def render(rows: list[dict[str, Any]]) -> str:
    def f(x: Any, fmt: str = "{:.3f}") -> str:
        return "-" if x is None else fmt.format(x)

    lines = [
        f"{'scenario':24s} {'action':10s} {'ok':3s} {'steps':>5s} {'before':>7s} {'during':>7s} "
        f"{'after':>7s} {'recovered':>9s}",
    ]
    for r in rows:
        lines.append(
            f"{r['name']:24s} {r['expected']:10s} {'yes' if r['mitigated'] else 'NO':3s} "
            f"{f(r['steps_to_mitigation'], '{}'):>5s} {f(r['before_s']):>7s} "
            f"{f(r['during_s']):>7s} {f(r['after_s']):>7s} "
            + (
                f"{f(r['recovered'], '{:.0%}'):>9s}"
                if r["during_s"] is not None
                else f"{'resumed' if r['resumed'] else 'stuck':>9s}"
            )
        )
    return "\n".join(lines)


def main(argv: list[str], *, service: str | None = None, only: str | None = None) -> int:
    from bench.eval.runner import Service

    ap = argparse.ArgumentParser(prog="failslow eval --mitigation")
    ap.add_argument(
        "--json", default=str(ROOT / "bench" / "results" / "mitigation.json"), help="report path"
    )
    args = ap.parse_args(argv)
    svc = Service(service, Path(tempfile.mkdtemp(prefix="failslow-mit-")), env_extra=ENV)
    rows = []
    try:
        http = httpx.Client(base_url=svc.url, timeout=300)
        todo = [c for c in cases() if not only or only in c.name]
        for n, case in enumerate(todo, 1):
            row = run_case(http, case)
            rows.append(row)
            print(
                f"[{n}/{len(todo)}] {case.name:24s} {row['actions']} "
                f"recovered={row['recovered']} ({row['seconds']:.0f}s)",
                file=sys.stderr,
                flush=True,
            )
    finally:
        svc.close()
    print(render(rows))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(rows, indent=2, default=str))
    print(f"\nJSON: {args.json}")
    return 0
