"""A real Prometheus (Debian's ``prometheus``) scrapes a running failslow service with the rules
from deploy/prometheus while a simulated job with a slow GPU and then a hang is replayed into it.
Through Prometheus's HTTP API: the metrics arrive, ``FailslowJobHung`` fires, and every PromQL
query of the Grafana dashboards in deploy/grafana (panels, annotations, the job variable)
returns data."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.procs import CLI, env_for, spawn, start_service, stop
from tests.live import free_port

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        PROMETHEUS is None, reason="prometheus not installed (Debian: apt-get install prometheus)"
    ),
]
JOB = "prom-job"


def _dashboard_queries() -> list[tuple[str, str]]:
    out = []
    for f in sorted((ROOT / "deploy" / "grafana" / "dashboards").glob("*.json")):
        d = json.loads(f.read_text())
        for p in d["panels"]:
            out += [(f"{f.name}: {p['title']}", t["expr"]) for t in p["targets"]]
        out += [(f"{f.name}: annotation {a['name']}", a["expr"]) for a in d["annotations"]["list"]]
    return out


def _query(prom: str, expr: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=10)
    if r.status_code == 503:  # still starting (TSDB not ready)
        raise httpx.HTTPError("prometheus not ready")
    assert r.status_code == 200, (expr, r.text)
    return list(r.json()["data"]["result"])


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except httpx.HTTPError:
            pass  # Prometheus still starting
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_prometheus_scrapes_alerts_and_answers_every_dashboard_query(tmp_path: Path) -> None:
    port, prom_port = free_port(), free_port()
    env = env_for(tmp_path / "failslow.db")
    env["FAILSLOW_FLEET__FLUSH_INTERVAL_S"] = "1"  # the hardware dashboard's parts, soon
    svc = start_service(port, tmp_path / "failslow.db", tmp_path / "service.log", env)
    cfg = tmp_path / "prometheus.yml"
    shipped = (ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text()
    cfg.write_text(
        shipped.replace("'failslow:8000', 'failslow-2:8000'", f"'127.0.0.1:{port}'")
        .replace(
            "/etc/prometheus/failslow-rules.yml",
            str(ROOT / "deploy" / "prometheus" / "failslow-rules.yml"),
        )
        .replace("scrape_interval: 15s", "scrape_interval: 1s")
        .replace("evaluation_interval: 15s", "evaluation_interval: 1s")
    )
    prom_proc = spawn(
        [str(PROMETHEUS), f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{prom_port}"],
        env, tmp_path / "prometheus.log",
    )  # fmt: skip
    prom = f"http://127.0.0.1:{prom_port}"
    try:
        _wait(lambda: bool(_query(prom, 'up{job="failslow"} == 1')), 60, "the first scrape")
        data = tmp_path / "job.jsonl"
        subprocess.run(
            [*CLI, "simulate", "--job", JOB, "--tp", "2", "--pp", "1", "--dp", "4",
             "--gpus-per-host", "2", "--steps", "120", "--seed", "1", "--quiet",
             "--fault", "slow_gpu:rank=3,start=30,factor=2.0",
             "--fault", "hang:rank=5,start=100", "--out", str(data)],
            check=True, timeout=300,
        )  # fmt: skip
        subprocess.run(
            [*CLI, "replay", str(data), "--service", f"http://127.0.0.1:{port}", "--quiet"],
            check=True, timeout=300,
        )  # fmt: skip
        _wait(
            lambda: bool(_query(prom, 'failslow_incidents_open{kind="hang"} > 0')),
            60,
            "the hang incident in Prometheus",
        )

        def firing() -> bool:
            r = httpx.get(f"{prom}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
            return any(
                a["labels"]["alertname"] == "FailslowJobHung" and a["state"] == "firing" for a in r
            )

        _wait(firing, 60, "FailslowJobHung to fire")
        assert _query(prom, f'failslow_job_ranks{{training_job="{JOB}"}} > 0')
        time.sleep(3)  # a few more scrapes for the rate() panels
        empty = []
        for name, expr in _dashboard_queries():
            expr = expr.replace("$training_job", JOB)
            result = _query(prom, expr)
            if not result:
                empty.append(f"{name}: {expr}")
        assert empty == [], "dashboard queries without data:\n" + "\n".join(empty)
        r = httpx.get(
            f"{prom}/api/v1/label/training_job/values",
            params={"match[]": "failslow_job_step_time_seconds"},
            timeout=10,
        )
        assert JOB in r.json()["data"]  # the job variable's label_values() query
        # every rule loaded; none failed to evaluate (the recording group runs every 30 s)
        groups = httpx.get(f"{prom}/api/v1/rules", timeout=10).json()["data"]["groups"]
        rules = [rule for g in groups for rule in g["rules"]]
        assert len(rules) == 11 and all(rule["health"] != "err" for rule in rules), [
            (rule["name"], rule.get("lastError")) for rule in rules if rule["health"] == "err"
        ]
        alerts = [rule for rule in rules if rule["type"] == "alerting"]
        assert all(rule["health"] == "ok" for rule in alerts)
    finally:
        stop(prom_proc)
        stop(svc)
