"""The agent's own /healthz and /metrics: healthy while it delivers, unhealthy (503, saying why)
once the service has taken nothing for longer than the bound; metrics in the Prometheus text
format with the training job and host."""

from __future__ import annotations

from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from failslow.agents.health import HealthServer
from failslow.agents.sdk import Recorder
from failslow.service.settings import Settings
from tests.agents.test_agent import JOB, accepted_on_service, feed, make_agent
from tests.live import live_service, wait_for


def test_health_and_metrics_follow_delivery(tmp_path: Path, db_url: str) -> None:
    with live_service(Settings(database_url=db_url)) as url:
        agent = make_agent(tmp_path, url)
        agent.start()
        server = HealthServer(agent, "127.0.0.1:0", stale_after_s=1.0).start()
        base = f"http://{server.address}"
        rec = Recorder(JOB, socket_path=str(tmp_path / "a.sock"), flush_interval_s=0.01)
        feed(rec, 50)
        assert rec.flush(timeout_s=30)
        assert wait_for(lambda: accepted_on_service(url) == 100, timeout=30)
        r = httpx.get(f"{base}/healthz")
        assert r.status_code == 200 and r.json()["status"] == "ok"
        assert r.json()["seconds_since_delivery"] < 5
        text = httpx.get(f"{base}/metrics").text
        families = {f.name: f for f in text_string_to_metric_families(text)}
        accepted = families["failslow_agent_records_accepted"].samples[0]
        assert accepted.value == 100
        assert accepted.labels == {"training_job": JOB, "host": "h0"}
        assert families["failslow_agent_healthy"].samples[0].value == 1
        rec.close()
    # the service is gone: nothing is taken any more, and after the bound the agent says so
    r = wait_for(lambda: (r := httpx.get(f"{base}/healthz")).status_code == 503 and r, 15)
    assert r.status_code == 503 and r.json()["status"] == "unhealthy"
    assert httpx.get(f"{base}/nope").status_code == 404
    server.stop()
    agent.stop(drain_timeout_s=0.1)
