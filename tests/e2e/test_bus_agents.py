"""Real node agents (v2: topology once, binary columns) through one replica on a real NATS
JetStream server: the replica is killed (SIGKILL) mid-run and started again; it resumes its
partitions from their snapshots and the stream, and every record the agents sent is counted
exactly once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.procs import CLI, env_for, spawn, start_service, stop
from tests.e2e.test_restart import agent_stats
from tests.infra import nats as natsinfra
from tests.live import free_port, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
JOB = "bus-job"


def test_agents_through_the_bus_survive_a_kill(tmp_path: Path) -> None:
    why = natsinfra.unavailable()
    if why:
        pytest.skip(why)
    with natsinfra.cluster(1) as nats:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        db = tmp_path / "db.sqlite"
        env = env_for(db)
        env.update({"FAILSLOW_BUS__URL": nats.url, "FAILSLOW_BUS__SNAPSHOT_EVERY_S": "0.5",
                    "FAILSLOW_BUS__OWNER_TTL_S": "2"})  # fmt: skip
        service = start_service(port, db, tmp_path / "service.log", env)
        agents = []
        for h in (0, 1):
            state = tmp_path / f"agent{h}"
            argv = [*CLI, "agent", "--service", url, "--job", JOB, "--host", f"h{h}",
                    "--socket", str(tmp_path / f"h{h}.sock"), "--state-dir", str(state),
                    "--flush-interval", "0.2", "--heartbeat", "1",
                    "--max-backoff", "0.5"]  # fmt: skip
            agents.append((state, spawn(argv, env, tmp_path / f"agent{h}.log")))
        assert wait_for(lambda: all((tmp_path / f"h{h}.sock").exists() for h in (0, 1)))
        out = tmp_path / "driver.json"
        driver = subprocess.Popen([sys.executable, str(Path(__file__).with_name("driver.py")),
                                   str(tmp_path), JOB, "8", str(out)])  # fmt: skip
        try:
            time.sleep(3)
            service.send_signal(signal.SIGKILL)
            service.wait()
            time.sleep(1)
            # the claims of the dead process expire (owner_ttl_s), then it owns them again
            service = start_service(port, db, tmp_path / "service.log", env)
            assert driver.wait(timeout=60) == 0
            fed = json.loads(out.read_text())
            assert fed["flushed"] and fed["dropped"] == 0
            assert wait_for(
                lambda: all(agent_stats(s).get("records_sealed") == agent_stats(s).get("records_in")
                            and agent_stats(s).get("outbox_envelopes") == 0 for s, _ in agents),
                timeout=60,
            )  # fmt: skip

            def counted() -> int:
                r = httpx.get(f"{url}/v1/jobs/{JOB}")
                if not r.is_success:
                    return -1
                return sum(h["accepted"] for h in r.json()["ingest"].values())

            assert wait_for(lambda: counted() == fed["records"], timeout=30), (counted(), fed)
            time.sleep(1.5)  # nothing is counted twice later either
            assert counted() == fed["records"]
            info = httpx.get(f"{url}/v1/replica").json()
            assert info["bus"] and any(JOB in p["jobs"] for p in info["owned"].values())
            assert sum(agent_stats(s)["retries"] for s, _ in agents) > 0  # the outage was felt
            log = (tmp_path / "service.log").read_text()
            assert "resumed at epoch" in log and "1 jobs" in log
        finally:
            driver.kill()
            for _, proc in agents:
                stop(proc)
            stop(service)
