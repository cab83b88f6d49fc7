"""An incident left open by a job that stopped reporting closes as stale, saying when the job
stopped; the open count goes back to 0 (a real service on uvicorn fed by the simulator)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from failslow.service.settings import DetectionSettings, Settings
from tests.cli.test_oncall import cli, feed
from tests.live import live_service, wait_for


def test_a_silent_jobs_incident_closes_as_stale(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path}/stale.db",
        detection=DetectionSettings(interval_s=0.05, close_stale_after_s=4),
    )
    with live_service(settings) as url:
        feed(url, "gone-job", "slow_gpu:rank=5,start=60,factor=2.0")
        first = httpx.get(f"{url}/v1/incidents").json()
        assert [(i["kind"], i["state"]) for i in first if i["kind"] == "slow_gpu"] == [
            ("slow_gpu", "open")
        ]

        def closed() -> list[dict[str, object]]:  # as on call: failslow get incidents -o json
            if cli(capsys, url, "get", "incidents", "--state", "open"):
                return []
            return cli(capsys, url, "get", "incidents")  # type: ignore[no-any-return]

        rows = wait_for(closed, 20)
        assert rows and all(r["resolution"] == "stale" for r in rows)
        gpu = next(r for r in rows if r["kind"] == "slow_gpu")
        job = httpx.get(f"{url}/v1/jobs/gone-job").json()
        assert gpu["evidence"]["resolution"]["last_seen_ns"] == job["last_seen_ns"]
        assert "Closed as stale: the job stopped reporting at" in gpu["summary"]
        metrics = httpx.get(f"{url}/metrics").text
        assert 'failslow_incidents_closed_stale_total{kind="slow_gpu"} 1.0' in metrics
        assert "failslow_incidents_open" in metrics
        for line in metrics.splitlines():
            if line.startswith("failslow_incidents_open{"):
                assert line.endswith(" 0.0"), line
