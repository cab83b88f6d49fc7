"""A simulated fleet: many jobs of different sizes and layouts on randomly placed hosts, with
faults that belong to hardware, not to jobs, streamed through a real service.

``FleetSpec`` describes the fleet (hosts x GPUs, each GPU with a UUID and a small fixed speed
of its own) and what is wrong with it: GPUs chronically a few percent slower, a NIC slow for a
share of the time, a host that fails hard once. ``run_fleet`` schedules jobs one after another,
placing each on random hosts that are not drained (as a scheduler honouring the fleet's drain
list would), streams each job's envelopes (host names and hardware inventories as node agents
would report them), flushes it, has the ledger take what detection saw, returns a failed host
from repair a few jobs later, and records after each job where the faulty parts stand.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from failslow.harness.simulator import Fault, Layout, Scenario
from failslow.harness.simulator.faults import FaultKind

Send = Callable[[str, str, dict[str, Any] | None], Any]  # (method, path, json) -> parsed body


@dataclass(frozen=True)
class FleetSpec:
    hosts: int = 64
    gpus_per_host: int = 8
    jobs: int = 40
    steps: tuple[int, int] = (150, 250)  # per job, drawn uniformly
    job_hosts: tuple[int, ...] = (2, 3, 4, 6, 8)
    slow_gpus: int = 2
    slow_gpu_factor: float = 1.06
    slow_nic_share: float = 0.10  # of each job's steps, in one episode
    slow_nic_factor: float = 3.0  # bandwidth / factor while slow
    # > 1: another host's NIC is this much slower in every job from its first step (below the
    # per-job link thresholds: only the jobs' passive link readings, pooled, can tell)
    chronic_nic_factor: float = 1.0
    fail_after_jobs: int = 8  # the failing host fails in its first job after this many jobs
    repair_jobs: int = 3  # returned from repair this many jobs after it failed
    gpu_spread: float = 0.005  # healthy GPUs' own fixed speed spread (sigma)
    seed: int = 0
    day_s: float = 86400.0  # one job per ``jobs / days``: jobs start spread over days
    days: float = 3.0


@dataclass
class Truth:
    slow_gpus: list[str]  # GPU UUIDs
    slow_nic_host: str
    failing_host: str
    speed: dict[str, float]  # GPU UUID -> its own fixed factor (healthy spread)
    gpu_host: dict[str, str]  # GPU UUID -> its host
    chronic_nic_host: str | None = None  # its NIC chronically slow (``chronic_nic_factor``)


@dataclass
class FleetRun:
    truth: Truth
    timeline: list[dict[str, Any]] = field(default_factory=list)  # after each job
    final: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # kind -> parts


def client_sender(client: Any) -> Send:
    """A ``Send`` over an in-process ``fastapi.testclient.TestClient`` of the service (ingest
    bodies gzipped as agents send them); a refused request raises with the service's answer."""
    from failslow.agents.wire import encode_envelope  # noqa: PLC0415

    gz = {"Content-Type": "application/json", "Content-Encoding": "gzip"}

    def send(method: str, path: str, body: dict[str, Any] | None) -> Any:
        if path == "/v1/ingest":
            r = client.post(path, content=encode_envelope(body), headers=gz)
        else:
            r = client.request(method, path, json=body)
        if r.status_code >= 300:
            raise RuntimeError(f"{method} {path}: {r.status_code} {r.text[:300]}")
        return r.json()

    return send


def host_name(i: int) -> str:
    return f"h{i:03d}"


def build_truth(spec: FleetSpec) -> tuple[Truth, dict[str, list[str]]]:
    rng = np.random.default_rng(spec.seed)
    uuids = {host_name(h): [f"GPU-{uuid.UUID(int=int(rng.integers(0, 2**63)) << 64 | h << 8 | g)}"
                            for g in range(spec.gpus_per_host)]
             for h in range(spec.hosts)}  # fmt: skip
    every = [u for us in uuids.values() for u in us]
    hosts = list(uuids)
    picks = rng.choice(len(hosts), size=2, replace=False)
    nic_host, failing = hosts[int(picks[0])], hosts[int(picks[1])]
    slow = [str(u) for u in rng.choice(every, size=spec.slow_gpus, replace=False)]
    speed = {u: float(np.clip(1 + rng.normal(0, spec.gpu_spread), 0.98, 1.02)) for u in every}
    where = {u: h for h, us in uuids.items() for u in us}
    chronic = None
    if spec.chronic_nic_factor > 1:  # drawn apart: the other parts stay as without it
        rest = [h for h in hosts if h not in (nic_host, failing)]
        chronic = rest[int(np.random.default_rng(spec.seed + 7).integers(len(rest)))]
    return Truth(slow, nic_host, failing, speed, where, chronic), uuids


def layout_for(n_hosts: int, gph: int, rng: np.random.Generator) -> Layout:
    world = n_hosts * gph
    options = [(tp, pp) for tp in (2, 4, 8) for pp in (1, 2, 4)
               if world % (tp * pp) == 0 and world // (tp * pp) >= 2]  # fmt: skip
    tp, pp = options[int(rng.integers(len(options)))]
    return Layout(tp=tp, pp=pp, dp=world // (tp * pp), gpus_per_host=gph)


def run_fleet(spec: FleetSpec, send: Send, *, progress: bool = True) -> FleetRun:
    """Run the fleet through the service that ``send`` talks to; what happened, job by job."""
    truth, uuids = build_truth(spec)
    rng = np.random.default_rng(spec.seed + 1)
    for host, us in uuids.items():  # what each node agent reports once
        gpus = [{"index": g, "uuid": u} for g, u in enumerate(us)]
        nics = [{"name": "mlx5_0", "kind": "infiniband"}]
        send("PUT", f"/v1/fleet/hosts/{host}/hardware",
             {"gpus": gpus, "nics": nics, "note": "fleet simulator"})  # fmt: skip
    run = FleetRun(truth)
    failed_at: int | None = None
    returned = False
    t0 = 1_780_000_000_000_000_000
    for j in range(spec.jobs):
        drained = {p["part"] for p in send("GET", "/v1/fleet/hosts?state=failed", None)}
        free = [h for h in uuids if h not in drained]
        n = min(int(rng.choice(spec.job_hosts)), len(free))
        placed = [free[int(i)] for i in rng.choice(len(free), size=n, replace=False)]
        layout = layout_for(n, spec.gpus_per_host, rng)
        steps = int(rng.integers(spec.steps[0], spec.steps[1] + 1))
        faults: list[Fault] = []
        for i, host in enumerate(placed):
            name = layout.hosts[i]
            for g, u in enumerate(uuids[host]):
                if u in truth.slow_gpus:
                    faults.append(Fault(FaultKind.SLOW_GPU, 0, factor=spec.slow_gpu_factor,
                                        ranks=(i * spec.gpus_per_host + g,)))  # fmt: skip
            if host == truth.slow_nic_host:
                span = max(8, int(steps * spec.slow_nic_share))
                start = int(rng.integers(40, max(41, steps - span)))
                faults.append(Fault(FaultKind.SLOW_NIC, start, start + span,
                                    factor=spec.slow_nic_factor, hosts=(name,)))  # fmt: skip
            if host == truth.chronic_nic_host:
                faults.append(Fault(FaultKind.SLOW_NIC, 0, factor=spec.chronic_nic_factor,
                                    hosts=(name,)))  # fmt: skip
            if host == truth.failing_host and failed_at is None and j >= spec.fail_after_jobs:
                faults.append(Fault(FaultKind.DEAD_HOST, int(steps * 0.6), hosts=(name,)))
                failed_at = j
        job = f"fleet-{spec.seed}-{j:03d}"
        start_ns = t0 + int(j * spec.days * spec.day_s / spec.jobs * 1e9)
        scenario = Scenario(job=job, layout=layout, steps=steps, faults=tuple(faults),
                            seed=spec.seed * 1000 + j, t0_ns=start_ns)  # fmt: skip
        sim = scenario.simulation()
        for i, host in enumerate(placed):  # the hardware's own speed travels with it
            for g, u in enumerate(uuids[host]):
                sim.static[i * spec.gpus_per_host + g] *= truth.speed[u]
        rename = dict(zip(layout.hosts, placed, strict=True))
        for env in scenario.envelopes(sim):
            send("POST", "/v1/ingest", {**env, "host": rename[env["host"]]})
        send("POST", f"/v1/jobs/{job}/flush", None)
        send("POST", "/v1/fleet/flush", None)
        if failed_at is not None and not returned and j >= failed_at + spec.repair_jobs:
            state = send("GET", f"/v1/fleet/hosts/{truth.failing_host}", None)["state"]
            if state == "failed":
                send("POST", f"/v1/fleet/hosts/{truth.failing_host}/return",
                     {"reason": "fleet simulator: repaired (PSU replaced)"})  # fmt: skip
                returned = True
        run.timeline.append(snapshot(j, job, placed, layout, steps, faults, truth, send))
        if progress:
            last = run.timeline[-1]
            print(f"\r  job {j + 1}/{spec.jobs}: {n} hosts {layout.tp}x{layout.pp}x"
                  f"{layout.dp}, {steps} steps; flagged {last['flagged']}", end="",
                  file=sys.stderr, flush=True)  # fmt: skip
    if progress:
        print(file=sys.stderr)
    for kind in ("hosts", "gpus", "nics"):
        run.final[kind] = send("GET", f"/v1/fleet/{kind}?sort=cost&limit=10000", None)
    return run


def snapshot(j: int, job: str, placed: list[str], layout: Layout, steps: int,
             faults: list[Fault], truth: Truth, send: Send) -> dict[str, Any]:  # fmt: skip
    flagged = {k: [p["part"] for p in send("GET", f"/v1/fleet/{k}?flagged=true", None)]
               for k in ("hosts", "gpus", "nics")}  # fmt: skip
    top = {k: [p["part"] for p in send("GET", f"/v1/fleet/{k}?sort=cost&limit=3", None)]
           for k in ("hosts", "gpus", "nics")}  # fmt: skip
    rows = send("GET", f"/v1/fleet/hosts?host={truth.failing_host}", None)
    failing = rows[0] if rows else None
    return {
        "job": job, "hosts": placed, "layout": [layout.tp, layout.pp, layout.dp],
        "steps": steps, "faults": [f.kind.value for f in faults],
        "flagged": sum(len(v) for v in flagged.values()), "flagged_parts": flagged, "top": top,
        "failing_host_state": failing["state"] if failing else None,
    }  # fmt: skip


def score(run: FleetRun, spec: FleetSpec) -> dict[str, Any]:
    """Where the faulty parts rank, after how many of their jobs they were flagged, what else
    was flagged."""
    t = run.truth
    nic = f"{t.slow_nic_host}/mlx5_0"
    faulty = {"gpus": set(t.slow_gpus), "nics": {nic}}
    if t.chronic_nic_host is not None:
        faulty["nics"].add(f"{t.chronic_nic_host}/mlx5_0")
    out: dict[str, Any] = {"parts": {}, "false_flags": []}
    for kind, parts in run.final.items():
        order = [p["part"] for p in parts]
        for p in parts:
            if p["flagged"] and p["part"] not in faulty.get(kind, set()):
                out["false_flags"].append({"kind": kind, "part": p["part"],
                                           "reasons": p["reasons"]})  # fmt: skip
        for part in faulty.get(kind, ()):
            row = next((p for p in parts if p["part"] == part), None)
            out["parts"][part] = {
                "kind": kind, "rank_by_cost": order.index(part) + 1 if part in order else None,
                "flagged": bool(row and row["flagged"]), "jobs": row["jobs_seen"] if row else 0,
                "slowness": row["slowness"] if row else None,
                "jobs_to_flag": jobs_to_flag(run, kind, part),
                "jobs_to_top": jobs_to_top(run, kind, part, len(faulty[kind])),
            }  # fmt: skip
    states = [s["failing_host_state"] for s in run.timeline if s["failing_host_state"]]
    out["failing_host"] = {"host": t.failing_host, "states": compress(states),
                           "final": states[-1] if states else None}  # fmt: skip
    out["ever_flagged_healthy"] = sorted({
        p for s in run.timeline for k, ps in s["flagged_parts"].items() for p in ps
        if p not in faulty.get(k, set())})  # fmt: skip
    return out


def _seen(run: FleetRun, kind: str, part: str) -> list[int]:
    """After each job, how many jobs the part had run in."""
    host = part.split("/")[0] if kind == "nics" else None
    seen, out = 0, []
    for s in run.timeline:
        if (host and host in s["hosts"]) or (not host and part in _gpus_of(run, s)):
            seen += 1
        out.append(seen)
    return out


def jobs_to_flag(run: FleetRun, kind: str, part: str) -> int | None:
    """How many jobs the part had run in when it was first flagged."""
    seen = _seen(run, kind, part)
    for i, s in enumerate(run.timeline):
        if part in s["flagged_parts"][kind]:
            return seen[i]
    return None


def jobs_to_top(run: FleetRun, kind: str, part: str, k: int) -> int | None:
    """How many jobs the part had run in when it entered its kind's top ``k`` by cost, to stay
    there to the end (None: not there at the end)."""
    seen = _seen(run, kind, part)
    since = None
    for i, s in enumerate(run.timeline):
        inside = part in s["top"][kind][:k]
        since = (since if since is not None else i) if inside else None
    return seen[since] if since is not None else None


def _gpus_of(run: FleetRun, s: dict[str, Any]) -> set[str]:
    return {u for u in run.truth.slow_gpus if run.truth.gpu_host[u] in s["hosts"]}


def compress(states: list[str]) -> list[str]:
    return [s for i, s in enumerate(states) if i == 0 or states[i - 1] != s]


__all__ = ["FleetRun", "FleetSpec", "build_truth", "client_sender", "run_fleet", "score"]
