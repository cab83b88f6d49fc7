"""Killing the service (SIGKILL) while agents stream, then restarting it, loses no records."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.procs import agent_stats, env_for, spawn_agent, start_service, stop
from tests.live import free_port, wait_for

pytestmark = pytest.mark.e2e
JOB = "restart-job"


@pytest.mark.parametrize("snapshots", ["default", "every-0.5s"])
def test_kill_and_restart_loses_nothing(tmp_path: Path, snapshots: str) -> None:
    """With snapshots every 0.5 s the restarted service resumes the job from one taken before
    the kill, with the database's newer positions and placements laid over it."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    db = tmp_path / "db.sqlite"
    env = env_for(db)
    if snapshots != "default":
        env["FAILSLOW_STATE__SNAPSHOT_EVERY_S"] = "0.5"
    service = start_service(port, db, tmp_path / "service.log", env)
    agents = []
    for h in (0, 1):
        state = tmp_path / f"agent{h}"
        agents.append(
            (
                state,
                spawn_agent(url, JOB, f"h{h}", state, tmp_path / f"h{h}.sock", env_for(db),
                            tmp_path / f"agent{h}.log"),  # fmt: skip
            )
        )
    assert wait_for(lambda: all((tmp_path / f"h{h}.sock").exists() for h in (0, 1)))
    out = tmp_path / "driver.json"
    driver = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).with_name("driver.py")),
            str(tmp_path),
            JOB,
            "8",
            str(out),
        ]
    )
    try:
        time.sleep(2.5)
        service.send_signal(signal.SIGKILL)  # no shutdown, no flush
        service.wait()
        time.sleep(2.5)
        service = start_service(port, db, tmp_path / "service.log", env)
        assert driver.wait(timeout=60) == 0
        fed = json.loads(out.read_text())
        assert fed["flushed"] and fed["dropped"] == 0
        assert wait_for(
            lambda: all(
                agent_stats(s).get("records_sealed") == agent_stats(s).get("records_in")
                and agent_stats(s).get("outbox_envelopes") == 0
                for s, _ in agents
            ),
            timeout=60,
        )
        ingest = httpx.get(f"{url}/v1/jobs/{JOB}").json()["ingest"]
        accepted = sum(h["accepted"] for h in ingest.values())
        assert accepted == fed["records"], (ingest, fed)
        assert sum(agent_stats(s)["records_in"] for s, _ in agents) == fed["records"]
        assert sum(agent_stats(s)["retries"] for s, _ in agents) > 0  # the outage was felt
    finally:
        driver.kill()
        for _, proc in agents:
            stop(proc)
        stop(service)
    for _, proc in agents:
        assert proc.returncode == 0
