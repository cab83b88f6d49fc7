"""Two replicas on one PostgreSQL database and a NATS JetStream server, scraped by a real
Prometheus with a kube-prometheus-style scrape configuration (no honor_labels): the training
job keeps its own label, and the fleet totals of the dashboards are the fleet's, not doubled
(each job's live series come from the one replica that owns it)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.deploy.test_prometheus_e2e import _query, _wait
from tests.e2e.procs import CLI, env_for, spawn, start_service, stop
from tests.infra import nats as natsinfra
from tests.live import free_port

PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (Debian: prometheus)"),
]
JOBS = ("fleet-a", "fleet-b", "fleet-c")

SCRAPE = """global: {{scrape_interval: 1s, evaluation_interval: 1s}}
scrape_configs:
  # as a ServiceMonitor renders it: the job is the Service's name, honor_labels left false
  - job_name: fs-failslow
    static_configs: [{{targets: [{targets}]}}]
"""


def _simulate(tmp: Path, job: str, seed: int) -> Path:
    out = tmp / f"{job}.jsonl"
    subprocess.run(
        [*CLI, "simulate", "--job", job, "--tp", "2", "--pp", "1", "--dp", "4",
         "--gpus-per-host", "2", "--steps", "100", "--seed", str(seed), "--quiet",
         "--fault", "slow_gpu:rank=3,start=30,factor=2.0", "--out", str(out)],
        check=True, timeout=300,
    )  # fmt: skip
    return out


def test_two_replicas_count_each_job_once(postgres: Any, tmp_path: Path) -> None:
    why = natsinfra.unavailable()
    if why:
        pytest.skip(why)
    with natsinfra.cluster(1) as nats:
        env = env_for(tmp_path / "unused.db")
        env.update({"FAILSLOW_DATABASE_URL": postgres.create_database(),
                    "FAILSLOW_BUS__URL": nats.url, "FAILSLOW_BUS__PARTITIONS": "8"})  # fmt: skip
        ports = [free_port(), free_port()]
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        procs = [start_service(p, tmp_path / "unused.db", tmp_path / f"r{i}.log", env)
                 for i, p in enumerate(ports)]  # fmt: skip
        prom_port = free_port()
        cfg = tmp_path / "prometheus.yml"
        cfg.write_text(SCRAPE.format(targets=", ".join(f"'127.0.0.1:{p}'" for p in ports)))
        prom_proc = spawn(
            [str(PROMETHEUS), f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            env, tmp_path / "prometheus.log",
        )  # fmt: skip
        prom = f"http://127.0.0.1:{prom_port}"
        try:
            _wait(lambda: len(_query(prom, 'up{job="fs-failslow"} == 1')) == 2, 60, "scrapes")
            for i, job in enumerate(JOBS):  # through either replica: the bus routes each job
                data = _simulate(tmp_path, job, seed=i)
                subprocess.run([*CLI, "replay", str(data), "--service", urls[i % 2], "--quiet"],
                               check=True, timeout=300)  # fmt: skip

            def open_total() -> float:
                got = _query(prom, "sum(failslow_incidents_open)")
                return float(got[0]["value"][1]) if got else 0.0

            _wait(lambda: open_total() >= len(JOBS), 60, "the slow GPUs in Prometheus")
            time.sleep(3)  # more scrapes: a doubled count would show by now
            db_open = sum(
                1 for u in urls[:1]
                for inc in httpx.get(f"{u}/v1/incidents", params={"state": "open"}).json()
            )  # fmt: skip
            assert open_total() == db_open >= len(JOBS)
            jobs = _query(prom, "sum(failslow_jobs)")
            assert float(jobs[0]["value"][1]) == len(JOBS)
            # the training job is its own label; Prometheus' `job` is the scrape's
            series = _query(prom, "failslow_job_state == 1")
            assert {s["metric"]["training_job"] for s in series} == set(JOBS)
            assert {s["metric"]["job"] for s in series} == {"fs-failslow"}
            assert not _query(prom, '{exported_job=~".+"}')
            by_job = _query(prom, "count by (training_job) (failslow_job_ranks)")
            # `failslow status`: every partition owned once, nothing left unapplied
            status = [_status(u) for u in urls]
            assert sum(s["partitions_owned"] for s in status) == 8
            assert _wait_lag(urls) == 0
            assert {s["metric"]["training_job"]: s["value"][1] for s in by_job} == dict.fromkeys(
                JOBS, "1"
            )  # one replica exports each job
        finally:
            stop(prom_proc)
            for p in procs:
                stop(p)


def _status(url: str) -> dict[str, Any]:
    r = subprocess.run([*CLI, "status", "--url", url, "-o", "json"], capture_output=True,
                       text=True, timeout=60, check=True)  # fmt: skip
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def _wait_lag(urls: list[str]) -> int:
    deadline = time.monotonic() + 30
    while True:
        lag = max(_status(u)["lag_max_seq"] for u in urls)
        if lag == 0 or time.monotonic() > deadline:
            return lag  # type: ignore[no-any-return]
        time.sleep(0.5)
