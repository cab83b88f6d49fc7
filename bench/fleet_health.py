"""Fleet health across jobs (issue 34): a simulated fleet of 64 hosts x 8 GPUs running 40 jobs of
different sizes and layouts over simulated days, with random placement; two GPUs chronically
1.06x slower, one NIC slow 10% of the time, one host that fails hard once and is repaired.

Every job's envelopes go through a real app (ingest, detection, the ledger) in this process
(FastAPI's TestClient: the fleet logic is what is measured here, not HTTP; ``failslow bench e2e``
measures the ingest path). Reported: where each faulty part ranks by cost among its kind, after
how many of its own jobs it was flagged and entered its kind's top for good, every healthy part
ever flagged (should be none), the repaired host's standing over time, and the ledger's size in
bytes per host per simulated day (SQLite's dbstat). ``--e2e``: also ``failslow bench e2e`` with
the ledger off and on (the same run twice each, alternating), to show what it costs ingest.

    .venv/bin/python bench/fleet_health.py                # ~20 min on 2 cores
    .venv/bin/python bench/fleet_health.py --e2e --json bench/results/fleet.json
    .venv/bin/python bench/fleet_health.py --jobs 40 --chronic-nic 1.3   # and a NIC 1.3x always
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from failslow.harness.fleet import FleetSpec, client_sender, run_fleet, score

ROOT = Path(__file__).resolve().parent.parent


def fleet_run(spec: FleetSpec, workdir: Path, probation_s: float) -> dict[str, Any]:
    from fastapi.testclient import TestClient  # noqa: PLC0415

    from failslow.service.app import create_app  # noqa: PLC0415
    from failslow.service.fleet.settings import FleetSettings  # noqa: PLC0415
    from failslow.service.settings import DetectionSettings, Settings  # noqa: PLC0415

    db = workdir / "fleet.db"
    settings = Settings(
        database_url=f"sqlite:///{db}",
        detection=DetectionSettings(interval_s=0.2),
        # the flush is driven by the harness after each job (POST /v1/fleet/flush); a simulated
        # job lasts about a minute of job time (150-250 steps), so probation is counted in
        # minutes here where production would say hours (the default is 6 h, 2 jobs)
        fleet=FleetSettings(flush_interval_s=3600, probation_s=probation_s, probation_jobs=2),
    )
    started = time.monotonic()
    with TestClient(create_app(settings)) as c:
        run = run_fleet(spec, client_sender(c))
        result = score(run, spec)
    result["wall_s"] = round(time.monotonic() - started, 1)
    result["ledger"] = ledger_size(db, spec)
    result["timeline"] = [{k: s[k] for k in ("job", "hosts", "layout", "steps", "faults",
                                             "flagged", "failing_host_state")}
                          for s in run.timeline]  # fmt: skip
    return result


def ledger_size(db: Path, spec: FleetSpec) -> dict[str, Any]:
    """Bytes the fleet tables take (pages of tables and indexes, dbstat), per host per day."""
    con = sqlite3.connect(db)
    try:
        rows = con.execute(
            "SELECT name, SUM(pgsize) FROM dbstat WHERE name LIKE 'fleet%' "
            "OR name LIKE 'ix_fleet%' OR name LIKE 'sqlite_autoindex_fleet%' GROUP BY name"
        ).fetchall()
        tables = ("fleet_parts", "fleet_readings", "fleet_marks", "fleet_inventory")
        counts = {t: con.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]  # noqa: S608
                  for t in tables}  # fmt: skip
    finally:
        con.close()
    total = sum(int(b) for _, b in rows)
    return {"bytes": total, "by_object": dict(rows), "rows": counts, "days": spec.days,
            "bytes_per_host_per_day": round(total / spec.hosts / spec.days)}  # fmt: skip


def e2e(fleet_on: bool, ranks: int, steps: int, flush_s: float) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAILSLOW_")}
    env["FAILSLOW_FLEET__ENABLED"] = "true" if fleet_on else "false"
    env["FAILSLOW_FLEET__FLUSH_INTERVAL_S"] = str(flush_s)
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "e2e.json"
        subprocess.run([sys.executable, "-m", "failslow.cli", "bench", "e2e", "--ranks",
                        str(ranks), "--steps", str(steps), "--fault", "slow_gpu", "--json",
                        str(out)], env=env, cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        return json.loads(out.read_text())  # type: ignore[no-any-return]


E2E_KEYS = ("records_per_s", "records_per_s_needed", "lag_steps_p50", "lag_steps_max",
            "service_cpu_s", "service_cpu_us_per_record", "rss_mib", "found", "delay_steps",
            "errors")  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, default=64)
    p.add_argument("--jobs", type=int, default=80)
    p.add_argument("--days", type=float, default=14.0, help="simulated days the jobs spread over")
    # production's default is 6 h in 2 jobs (jobs of hours: about two jobs' worth); a simulated
    # job lasts ~80 s of job time, so 90 s in 2 jobs is the same two clean jobs here (300 s
    # needed ~4, more than the failing host ran after its return in the 80-job fleet)
    p.add_argument("--probation-s", type=float, default=90.0,
                   help="clean job time a repaired host needs (simulated jobs last ~80 s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--chronic-nic", type=float, default=1.0, metavar="FACTOR",
                   help="also one NIC this much slower in every job (passive link readings)")
    p.add_argument("--e2e", action="store_true", help="also failslow bench e2e, ledger off/on")
    p.add_argument("--e2e-ranks", type=int, default=1024)
    p.add_argument("--e2e-steps", type=int, default=60)
    p.add_argument("--e2e-rounds", type=int, default=2)
    p.add_argument("--e2e-flush-s", type=float, default=30.0,
                   help="the ledger's flush interval in the e2e runs (default: the default)")
    p.add_argument("--e2e-only", action="store_true", help="only the bench e2e comparison")
    p.add_argument("--json", help="write the result here")
    args = p.parse_args()
    spec = FleetSpec(hosts=args.hosts, jobs=args.jobs, days=args.days, seed=args.seed,
                     fail_after_jobs=max(1, args.jobs // 5),
                     chronic_nic_factor=args.chronic_nic)  # fmt: skip
    result: dict[str, Any] = {"spec": spec.__dict__}
    if not args.e2e_only:
        with tempfile.TemporaryDirectory() as d:
            result |= fleet_run(spec, Path(d), args.probation_s)
    if args.e2e or args.e2e_only:
        runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
        for i in range(args.e2e_rounds):
            for arm in ("off", "on") if i % 2 == 0 else ("on", "off"):
                print(f"  bench e2e, ledger {arm} (round {i + 1})", file=sys.stderr)
                r = e2e(arm == "on", args.e2e_ranks, args.e2e_steps, args.e2e_flush_s)
                runs[arm].append({k: r[k] for k in E2E_KEYS if k in r})
        result["e2e"] = {"flush_interval_s": args.e2e_flush_s, **runs}
    text = json.dumps(result, indent=1, default=str)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text)
    keys = ("parts", "false_flags", "ever_flagged_healthy", "failing_host", "ledger", "wall_s")
    summary = {k: result[k] for k in keys if k in result}
    if "e2e" in result:
        summary["e2e"] = result["e2e"]
    print(json.dumps(summary, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
