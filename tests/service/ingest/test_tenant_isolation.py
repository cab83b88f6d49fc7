"""Through the API: a refused request makes no job, and one tenant's jobs cannot push another's
out of memory (issue 31, case 2: a teamA token's heartbeats for 1,100 unknown jobs, each
answered 409, evicted teamB's job 30 times in 42 s, and what teamB had been sent — 57,600
acknowledged records — was never analysed)."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from failslow.service.app import create_app
from failslow.service.auth import hash_token
from failslow.service.settings import Settings
from failslow.wire import v2
from tests.helpers import MS, T0, two_hosts
from tests.service.ingest.test_ingest_v2 import HEADERS

A = {"Authorization": "Bearer team-a"}
B = {"Authorization": "Bearer team-b"}
READ = {"Authorization": "Bearer reader"}


def _scoped(settings: Settings, **state: Any) -> Settings:
    scopes = {hash_token("team-a"): ["teamA-*"], hash_token("team-b"): ["teamB-*"]}
    return settings.model_copy(update={
        "auth": settings.auth.model_copy(update={"ingest_scopes": scopes,
                                                 "read_tokens": [hash_token("reader")]}),
        "state": settings.state.model_copy(update=state),
    })  # fmt: skip


def _register(c: TestClient, job: str, headers: dict[str, str]) -> str:
    h0, _ = two_hosts()
    r = c.put(f"/v2/jobs/{job}/topology/h0", headers=headers,
              json={"sent_ns": T0, "ranks": h0["ranks"], "comms": h0["comms"]})  # fmt: skip
    assert r.status_code == 200, r.text
    return str(r.json()["digest"])


def _heartbeat(job: str, digest: str) -> bytes:
    return v2.encode({"job": job, "host": "h0", "sent_ns": T0, "agent": "h0-a", "batch_seq": 0,
                      "topology": digest}, {}, {})  # fmt: skip


def test_requests_refused_make_no_job(settings: Settings) -> None:
    with TestClient(create_app(_scoped(settings, max_jobs=8))) as c:
        ctx = c.app.state.ctx  # type: ignore[attr-defined]
        d = _register(c, "teamB-1", B)
        bodies = [_heartbeat(f"teamA-{i}", d) for i in range(100)]
        r = c.post("/v2/ingest/bundle", content=v2.encode_bundle(bodies),
                   headers={"Content-Type": v2.BUNDLE_MEDIA_TYPE, **A})  # fmt: skip
        assert [item["status"] for item in r.json()["items"]] == [409] * 100
        r = c.post("/v2/ingest", content=_heartbeat("teamA-x", d), headers={**HEADERS, **A})
        assert r.status_code == 409 and "register it again" in r.json()["detail"]
        bad = {"sent_ns": T0, "ranks": [{"rank": 0, "gpu": 0}, {"rank": 0, "gpu": 1}], "comms": []}
        r = c.put("/v2/jobs/teamA-bad/topology/h0", headers=A, json=bad)
        assert r.status_code == 422
        assert [s.job for s in ctx.jobs.all()] == ["teamB-1"]
        assert c.get("/v1/jobs/teamA-bad", headers=READ).status_code == 404


def test_a_tenant_making_job_after_job_never_evicts_another_tenants_job(
    settings: Settings,
) -> None:
    with TestClient(create_app(_scoped(settings, max_jobs=4))) as c:
        ctx = c.app.state.ctx  # type: ignore[attr-defined]
        d = _register(c, "teamB-1", B)
        header = {"job": "teamB-1", "host": "h0", "sent_ns": T0 + MS, "agent": "h0-a",
                  "batch_seq": 0, "topology": d}  # fmt: skip
        cols = {"rank": [0, 1], "seq": [0, 0], "start_ns": [T0, T0 + 1], "end_ns": [T0 + MS] * 2,
                "comm": [0, 0], "op": [0, 0], "bytes": [8, 8], "peer": [v2.NO_PEER] * 2}
        body = v2.encode(header, cols, {"rank": [], "step": [], "start_ns": [], "end_ns": []})
        r = c.post("/v2/ingest", content=body, headers={**HEADERS, **B})
        assert r.status_code == 200 and r.json()["accepted"] == 2
        for i in range(12):
            _register(c, f"teamA-{i}", A)  # real jobs of its own: at most 2 held (its share)
            held = {s.job for s in ctx.jobs.all()}
            assert "teamB-1" in held and len(held - {"teamB-1"}) <= 2, held
        detail = c.get("/v1/jobs/teamB-1", headers=READ).json()
        assert detail["detector"]["pending_collectives"] == 1  # still waiting for h1's ranks
