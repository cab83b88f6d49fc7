"""One host's clock cannot move a job's event time (issue 17): a healthy simulated job through
the real app, with one host's heartbeat an hour ahead and one forged at int64 max mid-way."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from failslow.harness.simulator import Layout, Scenario
from failslow.service.app import create_app
from failslow.service.settings import Settings

HOUR = 3600 * 10**9


def test_a_host_an_hour_ahead_opens_nothing_and_is_flagged(tmp_path: Path) -> None:
    sc = Scenario(job="clocks", layout=Layout(tp=2, pp=2, dp=2, gpus_per_host=2), steps=60, seed=5)
    sim = sc.simulation()
    envelopes = list(sc.envelopes(sim))
    with TestClient(create_app(Settings(database_url=f"sqlite:///{tmp_path}/f.db"))) as client:
        for i, env in enumerate(envelopes):
            if i == len(envelopes) // 2:
                for sent in (env["sent_ns"] + HOUR, 2**63 - 1):
                    beat = {"job": "clocks", "host": "node-002", "sent_ns": sent}
                    assert client.post("/v1/ingest", json=beat).status_code == 200
            assert client.post("/v1/ingest", json=env).status_code == 200
        client.post("/v1/jobs/clocks/flush")
        newest = max(e["sent_ns"] for e in envelopes)
        detail = client.get("/v1/jobs/clocks").json()
        assert detail["watermark_ns"] <= newest + 2 * 10**9
        assert detail["detector"]["frames_analysed"] == 60  # no frame closed early or dropped
        assert client.get("/v1/jobs/clocks/incidents").json() == []  # no hang, nothing
        assert detail["detector"]["clock"]["held_back_envelopes"] == 2
        metrics = client.get("/metrics").text
        assert 'failslow_job_clock_held_back_envelopes_total{training_job="clocks"} 2.0' in metrics
