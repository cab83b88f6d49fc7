"""Reading detection results over REST after streaming a simulated job through the real app."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from failslow.harness.simulator import Fault, Layout, Scenario
from failslow.service.app import create_app
from failslow.service.settings import Settings

pytestmark = pytest.mark.both_databases  # storage and API: SQLite and PostgreSQL

SPEC_JOB_FIELDS = {
    "job",
    "world_size",
    "hosts",
    "state",
    "step",
    "step_time_s",
    "baseline_step_time_s",
    "slowdown",
    "open_incidents",
    "first_seen_ns",
    "last_seen_ns",
    "watermark_ns",
}
SPEC_INCIDENT_FIELDS = {
    "id",
    "job",
    "kind",
    "ranks",
    "hosts",
    "state",
    "slowdown",
    "subject_slowdown",
    "confidence",
    "onset_ns",
    "detected_ns",
    "resolved_ns",
    "onset_step",
    "detected_step",
    "summary",
    "evidence",
}


@pytest.fixture(scope="module")
def streamed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, dict]]:  # type: ignore[type-arg]
    db = tmp_path_factory.mktemp("db") / "f.db"
    sc = Scenario(
        job="train-1",
        layout=Layout(tp=2, pp=2, dp=4, gpus_per_host=4),
        steps=110,
        faults=(Fault("slow_gpu", 40, 80, factor=1.5, ranks=(6,)),),
        seed=3,
    )
    sim = sc.simulation()
    with TestClient(create_app(Settings(database_url=f"sqlite:///{db}"))) as client:
        for env in sc.envelopes(sim):
            assert client.post("/v1/ingest", json=env).status_code == 200
        summary = client.post("/v1/jobs/train-1/flush").json()
        yield client, {"summary": summary, "labels": sc.labels(sim)}


def test_job_summary(streamed) -> None:  # type: ignore[no-untyped-def]
    client, data = streamed
    jobs = client.get("/v1/jobs").json()
    assert [j["job"] for j in jobs] == ["train-1"]
    job = jobs[0]
    assert job.keys() >= SPEC_JOB_FIELDS
    assert (job["world_size"], job["hosts"], job["step"]) == (16, 4, 109)
    assert job["state"] == "healthy"  # the fault ended at step 80 and the incident resolved
    assert 0.3 < job["baseline_step_time_s"] < 0.6
    assert job["slowdown"] == pytest.approx(1.0, abs=0.05)
    assert job["open_incidents"] == 0
    assert data["summary"]["job"] == "train-1"


def test_job_detail(streamed) -> None:  # type: ignore[no-untyped-def]
    client, _ = streamed
    detail = client.get("/v1/jobs/train-1").json()
    assert detail["ranks"] == 16 and detail["comms"] > 0
    assert detail["detector"]["mode"] == "steps"
    assert detail["detector"]["frames_analysed"] == 110
    assert set(detail["ingest"]) == {"node-000", "node-001", "node-002", "node-003"}
    total = sum(h["accepted"] for h in detail["ingest"].values())
    assert total > 10_000


def test_incident_lifecycle_over_rest(streamed) -> None:  # type: ignore[no-untyped-def]
    client, data = streamed
    all_ = client.get("/v1/jobs/train-1/incidents").json()
    assert len(all_) == 1
    inc = all_[0]
    assert inc.keys() >= SPEC_INCIDENT_FIELDS
    assert (inc["kind"], inc["ranks"], inc["hosts"], inc["state"]) == (
        "slow_gpu",
        [6],
        ["node-001"],
        "resolved",
    )
    onset_ns = data["labels"]["faults"][0]["onset_ns"]
    # found in the third slow step: a 1.5x rank is severe (issue 32; 4 steps for less)
    assert inc["onset_step"] == 40 and inc["detected_step"] == 42
    # the resolved incident says what the fault cost while it lasted, not the recovered frames
    # its resolution was decided on (it reported "+0%, minor" before issue 32): the simulator's
    # own step times with and without it say 1.32x over steps 42-79
    assert inc["slowdown"] == pytest.approx(1.32, abs=0.05)
    assert inc["evidence"]["attributed_slowdown"] == pytest.approx(1.32, abs=0.05)
    assert inc["severity"] == "major" and "adds 3" in inc["summary"]
    assert inc["detected_ns"] > onset_ns and inc["detected_ns"] - onset_ns < 3e9
    assert inc["resolved_ns"] > inc["detected_ns"] and inc["resolved_step"] >= 80
    assert "rank 6" in inc["summary"] and "since step 40" in inc["summary"]
    assert inc["evidence"]["detector"] == "peer_lateness" and inc["evidence"]["reason"]
    assert client.get("/v1/jobs/train-1/incidents?state=open").json() == []
    assert [i["id"] for i in client.get("/v1/jobs/train-1/incidents?state=resolved").json()] == [
        inc["id"]
    ]
    assert client.get(f"/v1/incidents/{inc['id']}").json() == inc


def test_ranks(streamed) -> None:  # type: ignore[no-untyped-def]
    client, _ = streamed
    ranks = client.get("/v1/jobs/train-1/ranks").json()
    assert [r["rank"] for r in ranks] == list(range(16))
    assert {r["state"] for r in ranks} == {"ok"}
    assert all(0.85 < r["score"] < 1.15 for r in ranks)
    assert ranks[6]["host"] == "node-001" and ranks[6]["gpu"] == 2
    url = "/v1/jobs/train-1/ranks"
    assert client.get(url, params={"state": "slow"}).json() == []
    assert client.get(url, params={"state": ["slow", "ok"]}).json() == ranks
    assert client.get(url, params={"state": "ok"}).json() == ranks
    assert client.get(url, params={"state": "fast"}).status_code == 422


def test_not_found_and_bad_parameters_are_problems(streamed) -> None:  # type: ignore[no-untyped-def]
    client, _ = streamed
    for path in (
        "/v1/jobs/nope",
        "/v1/jobs/nope/ranks",
        "/v1/jobs/nope/incidents",
        "/v1/incidents/inc_x",
    ):
        r = client.get(path)
        assert r.status_code == 404 and r.headers["content-type"] == "application/problem+json", (
            path
        )
    r = client.get("/v1/jobs/train-1/incidents?state=sideways")
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == "query.state"
    assert client.post("/v1/jobs/nope/flush").status_code == 404


def test_ops_endpoints(streamed) -> None:  # type: ignore[no-untyped-def]
    client, _ = streamed
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ready"}
    assert client.get("/docs").status_code == 200


def test_openapi_matches_the_spec(streamed) -> None:  # type: ignore[no-untyped-def]
    client, _ = streamed
    doc = client.get("/openapi.json").json()
    paths = doc["paths"]
    expected = {
        "/v1/ingest": "post",
        "/v1/jobs": "get",
        "/v1/jobs/{job}": "get",
        "/v1/jobs/{job}/ranks": "get",
        "/v1/jobs/{job}/incidents": "get",
        "/v1/incidents/{id}": "get",
        "/v1/jobs/{job}/flush": "post",
        "/healthz": "get",
        "/readyz": "get",
        "/metrics": "get",
    }
    for path, method in expected.items():
        assert method in paths.get(path, {}), path
    schemas = doc["components"]["schemas"]
    assert set(schemas["JobSummary"]["properties"]) >= SPEC_JOB_FIELDS
    assert set(schemas["IncidentOut"]["properties"]) >= SPEC_INCIDENT_FIELDS
    assert {"rank", "host", "gpu", "state", "score", "lateness_s"} <= set(
        schemas["RankOut"]["properties"]
    )
    env = schemas["Envelope"]
    assert {"job", "host", "sent_ns", "ranks", "comms", "collectives", "steps"} <= set(
        env["properties"]
    )
    assert set(env["required"]) == {"job", "host", "sent_ns"}
    assert {"rank", "comm", "seq", "op", "bytes", "start_ns", "end_ns", "peer"} <= set(
        schemas["CollectiveIn"]["properties"]
    )
    assert paths["/v1/ingest"]["post"]["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Envelope"
    }
    states = paths["/v1/jobs/{job}/incidents"]["get"]["parameters"][1]["schema"]
    if "$ref" in states:  # an enum is a component of its own
        states = schemas[states["$ref"].rsplit("/", 1)[1]]
    assert set(states["enum"]) == {"open", "resolved", "all"}


def test_history_is_downsampled_per_rank_and_job(streamed) -> None:  # type: ignore[no-untyped-def]
    from sqlalchemy import select

    from failslow.service.jobs.history import rank_history
    from failslow.service.jobs.models import JobHistory

    client, _ = streamed
    ctx = client.app.state.ctx
    with ctx.sessions() as s:
        jobs = s.scalars(select(JobHistory).order_by(JobHistory.bucket)).all()
        buckets = rank_history(s, job=jobs[0].job_id)
    assert [j.bucket for j in jobs] == list(range(0, 110, 10))  # one row per 10 steps
    assert sum(j.steps for j in jobs) == 110
    assert sorted(buckets) == [j.bucket for j in jobs]  # per rank: a column per bucket
    assert all(sorted(c.rank.tolist()) == list(range(16)) for c in buckets.values())
    assert sum(int(c.steps.sum()) for c in buckets.values()) == 16 * 110
    rank6 = {b: {f: float(v[c.rank.tolist().index(6)]) for f, v in c.values.items()}
             for b, c in buckets.items()}  # fmt: skip
    # the fault (steps 40-80) shows in rank 6's bucket means, and its job slowdown
    assert rank6[50]["lateness_s"] > 0.05 and rank6[10]["lateness_s"] < 0.01
    assert rank6[50]["score"] < 0.75 < rank6[10]["score"]
    answer = client.get(f"/v1/jobs/{jobs[0].job_id}/history", params={"buckets": 5}).json()
    assert [b["bucket"] for b in answer["buckets"]] == [60, 70, 80, 90, 100]
    row6 = next(r for r in answer["ranks"] if r["rank"] == 6)
    assert row6["score"][0] == round(rank6[60]["score"], 6)
    by_bucket = {j.bucket: j for j in jobs}
    assert by_bucket[50].slowdown > 1.2 and by_bucket[10].slowdown < 1.05


def test_history_shows_the_slowest_ranks_and_is_not_sent_again_unchanged(streamed) -> None:  # type: ignore[no-untyped-def]
    client, _ = streamed
    url = "/v1/jobs/train-1/history"
    whole = client.get(url, params={"buckets": 11})
    assert whole.status_code == 200 and whole.headers["content-type"] == "application/json"
    body = whole.json()
    assert body["ranks_total"] == 16 and len(body["ranks"]) == 16
    lowest = {r["rank"]: min(s for s in r["score"] if s is not None) for r in body["ranks"]}
    slowest = sorted(lowest, key=lambda r: (lowest[r], r))[:3]
    assert slowest[0] == 6  # the slow GPU's rank
    cut = client.get(url, params={"buckets": 11, "max_ranks": 3}).json()
    assert [r["rank"] for r in cut["ranks"]] == sorted(slowest) and cut["ranks_total"] == 16
    assert cut["buckets"] == body["buckets"]
    tag = whole.headers["etag"]
    again = client.get(url, params={"buckets": 11}, headers={"If-None-Match": tag})
    assert again.status_code == 304 and again.headers["etag"] == tag and not again.content
    other = client.get(url, params={"buckets": 5}, headers={"If-None-Match": tag})
    assert other.status_code == 200 and other.headers["etag"] != tag
    assert client.get("/v1/jobs/nope/history").status_code == 404


def test_history_etag_changes_when_a_bucket_is_written(tmp_path) -> None:  # type: ignore[no-untyped-def]
    sc = Scenario(job="t", layout=Layout(tp=2, pp=1, dp=2, gpus_per_host=4), steps=30, seed=1)
    sim = sc.simulation()
    envelopes = list(sc.envelopes(sim))
    with TestClient(create_app(Settings(database_url=f"sqlite:///{tmp_path / 'f.db'}"))) as c:
        half = len(envelopes) // 2
        for env in envelopes[:half]:
            assert c.post("/v1/ingest", json=env).status_code == 200
        c.post("/v1/jobs/t/evaluate")
        first = c.get("/v1/jobs/t/history")
        for env in envelopes[half:]:
            assert c.post("/v1/ingest", json=env).status_code == 200
        c.post("/v1/jobs/t/flush")
        second = c.get("/v1/jobs/t/history", headers={"If-None-Match": first.headers["etag"]})
    assert second.status_code == 200 and second.headers["etag"] != first.headers["etag"]
    assert len(second.json()["buckets"]) > len(first.json()["buckets"])
