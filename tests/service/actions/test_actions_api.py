"""Actions and plans over REST through the real app: state machine, audit, approval, ETags."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from failslow.service.actions import service as actions
from failslow.service.actions.models import Action
from failslow.service.actions.policy import ActionSpec
from failslow.service.app import create_app
from failslow.service.db import session_scope
from failslow.service.incidents import service as incidents
from failslow.service.settings import ActionsSettings, AuthSettings, DetectionSettings, Settings
from tests.helpers import T0, envelope, two_hosts

pytestmark = pytest.mark.both_databases  # storage and API: SQLite and PostgreSQL

JOB = "job-a"


def _settings(db_url: str, **kw: Any) -> Settings:
    return Settings(
        database_url=db_url, detection=DetectionSettings(interval_s=3600), **kw
    )  # the loop stays idle: tests drive passes explicitly


@pytest.fixture
def app_client(db_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(_settings(db_url))) as c:
        h0, _ = two_hosts()
        assert c.post("/v1/ingest", json=envelope(job=JOB, **h0)).status_code == 200
        yield c


def _ctx(c: TestClient) -> Any:
    return c.app.state.ctx  # type: ignore[attr-defined]


def _open_hang(c: TestClient) -> str:
    draft = incidents.IncidentDraft(
        job=JOB,
        kind="hang",
        subject="job",
        ranks=[1],
        hosts=["h0"],
        slowdown=None,
        subject_slowdown=None,
        confidence=0.99,
        onset_ns=T0 - 10**9,
        detected_ns=T0,
        onset_step=None,
        detected_step=None,
        summary="hung",
        evidence={},
    )
    with session_scope(_ctx(c).sessions) as s:
        row, _ = incidents.open_incident(s, draft=draft, now_ns=T0)
        return row.id


def _propose(c: TestClient, kind: str = "isolate", mode: str = "manual") -> str:
    spec = ActionSpec(kind, "host:h0", "because", {"host": "h0", "ranks": [0, 1]}, rung=3)
    with session_scope(_ctx(c).sessions) as s:
        row, created = actions.propose(
            s,
            job=JOB,
            incident=None,
            spec=spec,
            mode=mode,
            actuator="log",
            dry_run=False,
            now_ns=T0,
            event_ns=T0,
        )
        assert created
        return row.id


def test_a_hang_gets_notify_then_manual_isolate_and_restart(app_client: TestClient) -> None:
    c = app_client
    inc = _open_hang(c)
    assert c.post(f"/v1/jobs/{JOB}/evaluate").status_code == 200
    first = c.get(f"/v1/jobs/{JOB}/actions").json()
    assert [(a["kind"], a["state"]) for a in first] == [("notify", "succeeded")]
    c.post(f"/v1/jobs/{JOB}/evaluate")
    acts = {a["kind"]: a for a in c.get(f"/v1/jobs/{JOB}/actions").json()}
    assert acts["isolate"]["state"] == "proposed" and acts["isolate"]["mode"] == "manual"
    assert acts["restart"]["state"] == "proposed"
    assert acts["isolate"]["incident"] == inc and "hung" in acts["isolate"]["reason"]
    spec_fields = {"id", "incident", "kind", "target", "state", "reason", "created_ns",
                   "updated_ns", "actuator", "result"}  # fmt: skip
    assert spec_fields <= set(acts["isolate"])
    for _ in range(3):  # manual actions wait, and the policy does not propose them twice
        c.post(f"/v1/jobs/{JOB}/evaluate")
    again = c.get(f"/v1/jobs/{JOB}/actions").json()
    assert len(again) == 3 and {a["state"] for a in again if a["kind"] != "notify"} == {"proposed"}

    r = c.post(f"/v1/actions/{acts['isolate']['id']}/approve", json={"actor": "alice"})
    assert r.status_code == 200 and r.json()["state"] in ("approved", "succeeded")
    c.post(f"/v1/actions/{acts['restart']['id']}/approve", json={"actor": "alice"})
    c.post(f"/v1/jobs/{JOB}/evaluate")
    done = {a["kind"]: a for a in c.get(f"/v1/jobs/{JOB}/actions").json()}
    assert done["isolate"]["state"] == "succeeded" and done["restart"]["state"] == "succeeded"
    assert done["isolate"]["decided_by"] == "local:testclient"  # the token's, not the body's
    plan = c.get(f"/v1/jobs/{JOB}/plan").json()
    assert plan["excluded_hosts"] == ["h0"] and plan["excluded_ranks"] == [0, 1]
    assert plan["restart_epoch"] == 1 and plan["version"] == 2
    trail = c.get(f"/v1/actions/{done['isolate']['id']}/events").json()
    assert [(e["from_state"], e["to_state"]) for e in trail] == [
        (None, "proposed"),
        ("proposed", "approved"),
        ("approved", "executing"),
        ("executing", "succeeded"),
    ]
    assert trail[1]["actor"] == "local:testclient"
    metrics = c.get("/metrics").text
    assert 'failslow_actions_total{kind="isolate",state="succeeded"} 1.0' in metrics
    assert "failslow_plans_published_total 2.0" in metrics


def test_reject_records_why_and_is_final(app_client: TestClient) -> None:
    c = app_client
    aid = _propose(c)
    r = c.post(f"/v1/actions/{aid}/reject", json={"reason": "node under maintenance already"})
    assert r.status_code == 200
    body = r.json()
    assert body["state"] == "rejected" and body["result"] == {
        "rejected": "node under maintenance already"
    }
    assert c.post(f"/v1/actions/{aid}/reject").status_code == 200  # same decision: idempotent
    late = c.post(f"/v1/actions/{aid}/approve")
    assert late.status_code == 409
    assert late.headers["content-type"].startswith("application/problem+json")
    assert "rejected" in late.json()["detail"]
    trail = c.get(f"/v1/actions/{aid}/events").json()
    assert trail[-1]["note"] == "node under maintenance already"


def test_unknown_ids_are_404(app_client: TestClient) -> None:
    c = app_client
    assert c.get("/v1/actions/act_nope").status_code == 404
    assert c.post("/v1/actions/act_nope/approve").status_code == 404
    assert c.get("/v1/jobs/nope/actions").status_code == 404
    assert c.get("/v1/jobs/nope/plan").status_code == 404


def test_plan_etag_and_conditional_get(app_client: TestClient) -> None:
    c = app_client
    r = c.get(f"/v1/jobs/{JOB}/plan")
    assert r.status_code == 200 and r.json()["version"] == 0
    tag = r.headers["etag"]
    assert c.get(f"/v1/jobs/{JOB}/plan", headers={"If-None-Match": tag}).status_code == 304
    aid = _propose(c, kind="isolate")
    c.post(f"/v1/actions/{aid}/approve")
    c.post(f"/v1/jobs/{JOB}/evaluate")
    r2 = c.get(f"/v1/jobs/{JOB}/plan", headers={"If-None-Match": tag})
    assert r2.status_code == 200 and r2.json()["version"] == 1
    assert r2.headers["etag"] != tag
    hist = c.get(f"/v1/jobs/{JOB}/plan/history").json()
    assert [h["version"] for h in hist] == [1] and hist[0]["action"] == aid


def test_workload_declaration(app_client: TestClient) -> None:
    c = app_client
    r = c.put(f"/v1/jobs/{JOB}/workload", json={"global_batch": 64})
    assert r.status_code == 200 and r.json()["global_batch"] == 64
    assert c.put(f"/v1/jobs/{JOB}/workload", json={"global_batch": 0}).status_code == 422
    assert c.put("/v1/jobs/nope/workload", json={"global_batch": 8}).status_code == 404


def test_an_action_interrupted_by_a_crash_is_never_run_again(db_url: str, tmp_path: Path) -> None:
    with TestClient(create_app(_settings(db_url))) as c:
        h0, _ = two_hosts()
        c.post("/v1/ingest", json=envelope(job=JOB, **h0))
        aid = _propose(c, mode="auto")
        with session_scope(_ctx(c).sessions) as s:  # the crash: claimed, never finished
            assert actions.claim(s, action_id=aid, now_ns=T0)
    marker = tmp_path / "hook.log"
    settings = _settings(
        db_url,
        actions=ActionsSettings(
            actuators=["log", "plan", "slurm"],
            actuator_for={"isolate": "slurm"},
            slurm_scontrol=str(_recorder(tmp_path, marker)),
        ),
    )
    with TestClient(create_app(settings)) as c:
        c.post(f"/v1/jobs/{JOB}/evaluate")
        a = c.get(f"/v1/actions/{aid}").json()
        assert a["state"] == "failed" and "not run again" in a["result"]["error"]
        assert c.post(f"/v1/actions/{aid}/approve").status_code == 409
    assert not marker.exists()


def _recorder(tmp_path: Path, marker: Path) -> Path:
    exe = tmp_path / "scontrol"
    exe.write_text(f'#!/bin/sh\necho "$*" >> {marker}\n')
    exe.chmod(0o755)
    return exe


def test_exactly_one_of_two_racing_claims_wins(app_client: TestClient) -> None:
    aid = _propose(app_client, mode="auto")
    results: list[bool] = []
    barrier = threading.Barrier(2)

    def claim() -> None:
        barrier.wait()
        with session_scope(_ctx(app_client).sessions) as s:
            results.append(actions.claim(s, action_id=aid, now_ns=T0))

    threads = [threading.Thread(target=claim) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False, True]
    with session_scope(_ctx(app_client).sessions) as s:
        assert s.get(Action, aid).state == "executing"  # type: ignore[union-attr]


def test_the_same_decision_twice_creates_one_action(app_client: TestClient) -> None:
    spec = ActionSpec("notify", "incident:x", "r", rung=0)
    with session_scope(_ctx(app_client).sessions) as s:
        a, first = actions.propose(
            s, job=JOB, incident="x", spec=spec, mode="auto", actuator="log",
            dry_run=False, now_ns=T0, event_ns=T0,
        )  # fmt: skip
        b, second = actions.propose(
            s, job=JOB, incident="x", spec=spec, mode="auto", actuator="log",
            dry_run=False, now_ns=T0, event_ns=T0,
        )  # fmt: skip
    assert first and not second and a.id == b.id


def test_operators_decide_readers_only_read(db_url: str) -> None:
    auth = AuthSettings(ingest_tokens=["ing"], read_tokens=["rd"], operator_tokens=["op"])
    with TestClient(create_app(_settings(db_url, auth=auth))) as c:
        h0, _ = two_hosts()
        c.post("/v1/ingest", json=envelope(job=JOB, **h0), headers={"Authorization": "Bearer ing"})
        aid = _propose(c)
        assert c.get(f"/v1/actions/{aid}").status_code == 401
        assert (
            c.get(f"/v1/actions/{aid}", headers={"Authorization": "Bearer rd"}).status_code == 200
        )
        denied = c.post(f"/v1/actions/{aid}/approve", headers={"Authorization": "Bearer rd"})
        assert denied.status_code == 403
        ok = c.post(f"/v1/actions/{aid}/approve", headers={"Authorization": "Bearer op"})
        assert ok.status_code == 200
        plan = c.get(f"/v1/jobs/{JOB}/plan", headers={"Authorization": "Bearer ing"})
        assert plan.status_code == 200  # training jobs read their plan with the agents' token


def test_dry_run_executes_nothing_and_says_so(db_url: str) -> None:
    with TestClient(create_app(_settings(db_url, actions=ActionsSettings(dry_run=True)))) as c:
        h0, _ = two_hosts()
        c.post("/v1/ingest", json=envelope(job=JOB, **h0))
        _open_hang(c)
        c.post(f"/v1/jobs/{JOB}/evaluate")
        c.post(f"/v1/jobs/{JOB}/evaluate")
        for a in c.get(f"/v1/jobs/{JOB}/actions", params={"state": "proposed"}).json():
            c.post(f"/v1/actions/{a['id']}/approve")
        c.post(f"/v1/jobs/{JOB}/evaluate")
        acts = c.get(f"/v1/jobs/{JOB}/actions").json()
        plan = c.get(f"/v1/jobs/{JOB}/plan").json()
    assert {a["kind"] for a in acts} == {"notify", "isolate", "restart"}
    assert all(a["dry_run"] and a["state"] == "succeeded" for a in acts)
    assert all(a["result"]["dry_run"] is True for a in acts)
    assert plan["version"] == 0  # nothing was changed


def test_an_unacknowledged_plan_is_assumed_applied_after_the_timeout(db_url: str) -> None:
    settings = _settings(db_url, actions=ActionsSettings(plan_ack_timeout_s=0.001))
    with TestClient(create_app(settings)) as c:
        h0, _ = two_hosts()
        c.post("/v1/ingest", json=envelope(job=JOB, **h0))
        spec = ActionSpec("rebalance", f"job:{JOB}", "r", {"microbatch_shares": [3, 1]}, rung=1)
        with session_scope(_ctx(c).sessions) as s:
            row, _ = actions.propose(
                s, job=JOB, incident=None, spec=spec, mode="auto", actuator="plan",
                dry_run=False, now_ns=T0, event_ns=T0,
            )  # fmt: skip
        c.post(f"/v1/jobs/{JOB}/evaluate")  # executes: publishes the plan
        time.sleep(0.01)
        c.post(f"/v1/jobs/{JOB}/evaluate")  # past the timeout: adopted
        assert c.get(f"/v1/jobs/{JOB}/plan").json()["applied_step"] is None
        assert _ctx(c).detection.work_shares(JOB) == [3, 1]
