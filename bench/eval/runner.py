"""``failslow eval``: the scenario suite through a real service, baselines, bounds, real data.

Starts its own ``failslow serve`` process (fresh SQLite database) unless ``--service`` is given,
streams every scenario's envelopes over HTTP, flushes, reads the incidents back over REST and
scores them against the simulator's ground truth. Baselines run on the same data. Then the OSDI'25
Megatron traces and the TCPD benchmark. Prints one table per part and writes one JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.eval import baselines, osdi, suite, tcpd
from bench.eval.scoring import (
    Scored,
    run_baselines,
    score_case,
    slow_gpu_bound,
    summarise,
    table_text,
)

ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("FAILSLOW_SHARED_DIR") or ROOT.parent / "shared") / "datasets"


# -- the service -----------------------------------------------------------------------------------
class Service:
    def __init__(
        self, url: str | None, workdir: Path, env_extra: dict[str, str] | None = None
    ) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        if url is None:
            import socket

            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            env = {k: v for k, v in os.environ.items() if not k.startswith("FAILSLOW_")}
            env.update(
                {
                    "FAILSLOW_DATABASE_URL": f"sqlite:///{workdir}/eval.db",
                    "FAILSLOW_DETECTION__INTERVAL_S": "0.2",
                    **(env_extra or {}),
                }
            )
            log = open(workdir / "service.log", "wb")  # noqa: SIM115
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "failslow.cli",
                    "serve",
                    "--port",
                    str(port),
                    "--log-level",
                    "warning",
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
            )
            url = f"http://127.0.0.1:{port}"
        self.url = url.rstrip("/")
        self.http = httpx.Client(timeout=300)
        deadline = time.monotonic() + 60
        while True:
            try:
                if self.http.get(self.url + "/readyz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"service at {self.url} is not ready")
            time.sleep(0.1)

    def send(self, env: dict[str, Any]) -> None:
        r = self.http.post(
            self.url + "/v1/ingest",
            content=gzip.compress(orjson.dumps(env), 3),
            headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
        )
        r.raise_for_status()
        body = r.json()
        if body["rejected"]:
            raise RuntimeError(f"service rejected records: {body['rejected'][:3]}")

    def results(self, job: str) -> list[dict[str, Any]]:
        self.http.post(f"{self.url}/v1/jobs/{job}/flush").raise_for_status()
        return self.http.get(f"{self.url}/v1/jobs/{job}/incidents").json()  # type: ignore[no-any-return]

    def close(self) -> None:
        self.http.close()
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


# -- the run ---------------------------------------------------------------------------------------
def run_case(svc: Service, case: suite.Case) -> tuple[Scored, baselines.StepTable, dict[str, Any]]:
    started = time.monotonic()
    sim = case.scenario.simulation()
    table = baselines.StepTable()
    for env in case.scenario.envelopes(sim):
        svc.send(env)
        table.add(env)
    labels = case.scenario.labels(sim)
    scored = score_case(case, labels, svc.results(case.scenario.job))
    scored.seconds = round(time.monotonic() - started, 1)
    scored.baselines = run_baselines(table, labels)
    return scored, table, labels


def run_osdi(svc: Service) -> list[dict[str, Any]]:
    root = SHARED / "stragglers-osdi25"
    out = []
    for trace in ("AR", "ST", "SE"):
        for env in osdi.to_envelopes(root, trace):
            svc.send(env)
        incidents = svc.results(f"osdi-{trace}")
        out.append(osdi.judge(trace, incidents))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="failslow eval", description=__doc__.splitlines()[0])
    ap.add_argument("--service", help="use this running service instead of starting one")
    ap.add_argument("--quick", action="store_true", help="fewer layouts, 500-step healthy runs")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--only", help="run scenarios whose name contains this (a,b: either)")
    ap.add_argument("--skip-real", action="store_true", help="skip the OSDI'25 traces and TCPD")
    ap.add_argument(
        "--plain-envelopes",
        action="store_true",
        help="send envelopes as instrumentation that vouches for nothing does (no complete_ns "
        "or inflight_after_ns, no extra envelopes while a call is blocked): the hang detector "
        "then has only what it measures from the records",
    )
    ap.add_argument(
        "--batch-s",
        type=float,
        help="every host flushes this often (s; default: each scenario's own)",
    )
    ap.add_argument("--json", default=str(ROOT / "bench" / "results" / "eval.json"))
    ap.add_argument(
        "--mitigation",
        action="store_true",
        help="run the closed-loop mitigation scenarios instead (bench/eval/mitigation.py)",
    )
    args, rest = ap.parse_known_args(argv)
    if args.mitigation:
        from bench.eval import mitigation

        return mitigation.main(rest, service=args.service, only=args.only)
    if rest:
        ap.error(f"unrecognised arguments: {' '.join(rest)}")
    work = Path(tempfile.mkdtemp(prefix="failslow-eval-"))
    svc = Service(args.service, work)
    results: list[Scored] = []
    tables: dict[str, tuple[baselines.StepTable, dict[str, Any]]] = {}
    started = time.monotonic()
    try:
        todo = [
            c
            for c in suite.cases(quick=args.quick, seeds=args.seeds)
            if not args.only or any(o in c.name for o in args.only.split(","))
        ]
        if args.plain_envelopes or args.batch_s:
            change: dict[str, Any] = {"vouch": False} if args.plain_envelopes else {}
            if args.batch_s:
                change["batch_s"] = args.batch_s
            todo = [dataclasses.replace(c, scenario=dataclasses.replace(c.scenario, **change))
                    for c in todo]  # fmt: skip
        for n, case in enumerate(todo, 1):
            scored, table, labels = run_case(svc, case)
            results.append(scored)
            tables[case.name] = (table, labels)
            print(
                f"[{n:3d}/{len(todo)}] {case.name:40s} detected={scored.detected!s:5s} "
                f"localized={scored.localized!s:5s} "
                f"delay={scored.delay_steps} steps/{scored.delay_s} s "
                f"false={scored.false_incidents} "
                f"({scored.seconds:.0f}s, total {time.monotonic() - started:.0f}s)",
                file=sys.stderr,
                flush=True,
            )
        healthy_rank_steps = sum(
            r.world * r.steps for r in results if r.family in suite.HEALTHY_FAMILIES
        )
        arl = max(healthy_rank_steps, 1000)
        for r in results:
            table, labels = tables[r.name]
            r.bound_steps = slow_gpu_bound(table, labels, arl) if r.family == "slow_gpu" else None
        osdi_results = [] if args.skip_real else run_osdi(svc)
    finally:
        svc.close()
    tcpd_result = None if args.skip_real else tcpd.run(SHARED / "tcpd")
    summary = summarise(results)
    summary["cusum_arl_rank_steps"] = arl
    report = {
        "summary": summary,
        "scenarios": [r.__dict__ for r in results],
        "osdi25": osdi_results,
        "tcpd": tcpd_result,
        "envelopes": "plain" if args.plain_envelopes else "vouched",
        "batch_s": args.batch_s,
        "seconds": round(time.monotonic() - started, 1),
    }
    print(table_text(results))
    print("\nsummary:", json.dumps(summary, indent=2))
    if osdi_results:
        print("\nOSDI'25 traces:")
        for o in osdi_results:
            print(
                f"  {o['trace']}: {'PASS' if o['pass'] else 'FAIL'} incidents={o['incidents']} "
                f"missing={o['missing']} "
                f"unexpected={o['unexpected']}"
            )
    if tcpd_result:
        print("\nTCPD (25 local univariate series, production defaults):")
        print("  " + tcpd.render(tcpd_result).replace("\n", "\n  "))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    print(f"\nJSON: {args.json}")
    return 0
