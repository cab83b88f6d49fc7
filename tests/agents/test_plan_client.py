"""PlanClient: conditional polling, applying at step boundaries, never raising into training."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from failslow.agents.plan import Plan, PlanClient
from failslow.service.actions import service as actions
from failslow.service.actions.policy import ActionSpec
from failslow.service.app import create_app
from failslow.service.db import session_scope
from failslow.service.settings import DetectionSettings, Settings
from tests.helpers import T0, envelope, two_hosts


@pytest.fixture
def client(db_url: str) -> Iterator[TestClient]:
    settings = Settings(database_url=db_url, detection=DetectionSettings(interval_s=3600))
    with TestClient(create_app(settings)) as c:
        h0, _ = two_hosts()
        c.post("/v1/ingest", json=envelope(job="j", **h0))
        yield c


def _publish_rebalance(c: TestClient, shares: list[int]) -> None:
    ctx: Any = c.app.state.ctx  # type: ignore[attr-defined]
    spec = ActionSpec("rebalance", "job:j", "test", {"microbatch_shares": shares}, rung=1)
    with session_scope(ctx.sessions) as s:
        row, _ = actions.propose(
            s, job="j", incident=None, spec=spec, mode="auto", actuator="plan",
            dry_run=False, now_ns=T0, event_ns=T0,
        )  # fmt: skip
        aid = row.id
    ctx.mitigation.execute(aid)


def test_poll_returns_a_plan_only_when_it_changed(client: TestClient) -> None:
    seen: list[Plan] = []
    pc = PlanClient("", "j", client=client, global_batch=4, on_change=seen.append)
    assert pc.poll() is None  # version 0: nothing to apply
    assert pc.etag is not None
    assert client.get("/v1/jobs/j/plan", headers={"If-None-Match": pc.etag}).status_code == 304
    _publish_rebalance(client, [1, 3])
    plan = pc.poll()
    assert plan is not None and plan.version == 1 and plan.microbatch_shares == (1, 3)
    assert plan.microbatches(0, default=2) == 1 and plan.microbatches(5, default=2) == 2
    assert pc.poll() is None and seen == [plan]
    assert client.get("/v1/jobs/j").status_code == 200
    assert pc.declared  # the global batch was declared on the first poll


def test_background_polling_hands_the_plan_over_at_a_step_boundary(client: TestClient) -> None:
    pc = PlanClient("", "j", client=client).start(interval_s=0.02)
    try:
        assert pc.take() is None
        _publish_rebalance(client, [2, 2])
        deadline = time.monotonic() + 5
        plan = None
        while plan is None and time.monotonic() < deadline:
            time.sleep(0.02)
            plan = pc.take()
        assert plan is not None and plan.version == 1
        assert pc.take() is None  # handed over once
    finally:
        pc.close()


def test_a_dead_service_never_raises_into_training() -> None:
    pc = PlanClient("http://127.0.0.1:9", "j", global_batch=8, timeout_s=0.2)
    assert pc.poll() is None and pc.poll() is None
    assert pc.errors == 2 and pc.current.version == 0
    pc.close()


def test_garbage_plans_are_ignored() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"no": "version"})

    http = httpx.Client(base_url="http://x", transport=httpx.MockTransport(handler))
    pc = PlanClient("", "j", client=http)
    assert pc.poll() is None and pc.errors == 1
    http.close()


def test_a_failing_callback_does_not_stop_polling(client: TestClient) -> None:
    calls = threading.Event()

    def boom(plan: Plan) -> None:
        calls.set()
        raise RuntimeError("user bug")

    pc = PlanClient("", "j", client=client, on_change=boom)
    _publish_rebalance(client, [3, 1])
    assert pc.poll() is not None and calls.is_set()
    assert pc.current.version == 1


def test_ack_tells_the_service_from_which_step_a_plan_runs(client: TestClient) -> None:
    pc = PlanClient("", "j", client=client)
    _publish_rebalance(client, [1, 3])
    plan = pc.poll()
    assert plan is not None
    assert pc.ack(plan, 120) and pc.ack(plan, 120)  # idempotent
    assert not pc.ack(plan, 121)  # a different step for the same version: refused (409)
    assert client.get("/v1/jobs/j/plan").json()["applied_step"] == 120
    history = client.get("/v1/jobs/j/plan/history").json()
    assert history[0]["applied_step"] == 120
    missing = client.post("/v1/jobs/j/plan/ack", json={"version": 7, "step": 1})
    assert missing.status_code == 404
    rt = client.app.state.ctx.detection.runtime("j")  # type: ignore[attr-defined]
    assert rt is not None and rt.shares == [1, 3]  # detectors follow from step 120
    assert rt.pipeline._pending_work is not None and rt.pipeline._pending_work[0] == 120
