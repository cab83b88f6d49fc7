"""What an envelope may vouch for (docs/ingest-v1.md, "Completeness"): ``complete_ns`` and
``inflight_after_ns``, on v1 and v2, checked at the top level and kept per host for the hang
detector."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from failslow.wire import v2
from tests.helpers import MS, T0


def v1(**extra: Any) -> dict[str, Any]:
    return {"job": "vj", "host": "h0", "sent_ns": T0 + 1_000 * MS,
            "ranks": [{"rank": 0, "world_size": 1}], **extra}  # fmt: skip


def host_of(client: TestClient, job: str, host: str = "h0") -> Any:
    state = client.app.state.ctx.jobs.get(job)  # type: ignore[attr-defined]
    return state.topology.hosts[host]


@pytest.mark.parametrize(
    ("extra", "loc"),
    [
        ({"complete_ns": T0}, "complete_ns"),  # without inflight_after_ns
        ({"inflight_after_ns": 250 * MS}, "complete_ns"),
        ({"complete_ns": T0 + 2_000 * MS, "inflight_after_ns": 250 * MS}, "complete_ns"),
        ({"complete_ns": -1, "inflight_after_ns": 250 * MS}, "complete_ns"),
        ({"complete_ns": T0, "inflight_after_ns": "0.25"}, "inflight_after_ns"),
    ],
)
def test_v1_rejects_what_cannot_be_vouched_for(
    client: TestClient, extra: dict[str, Any], loc: str
) -> None:
    r = client.post("/v1/ingest", json=v1(**extra))
    assert r.status_code == 400, r.text  # (an invalid envelope: nothing stored)
    assert loc in [e["loc"] for e in r.json()["errors"]], r.json()


def test_v1_keeps_the_newest_vouch_and_a_heartbeat_keeps_it(client: TestClient) -> None:
    for complete in (T0 + 900 * MS, T0 + 800 * MS):  # an older one never moves it back
        r = client.post("/v1/ingest", json=v1(complete_ns=complete, inflight_after_ns=250 * MS))
        assert r.status_code == 200, r.text
    assert client.post("/v1/ingest", json=v1()).status_code == 200  # vouches for nothing new
    h = host_of(client, "vj")
    assert (h.complete_ns, h.inflight_after_ns) == (T0 + 900 * MS, 250 * MS)


def test_v2_headers_vouch_too(client: TestClient) -> None:
    reg = {"sent_ns": T0, "ranks": [{"rank": 0, "world_size": 1}],
           "comms": [{"comm": "dp", "kind": "dp", "ranks": [0]}]}  # fmt: skip
    r = client.put("/v2/jobs/vj2/topology/h0", json=reg)
    assert r.status_code == 200, r.text
    digest = r.json()["digest"]
    empty = {name: [] for name, _ in v2.COLLECTIVE_COLUMNS}
    steps = {name: [] for name, _ in v2.STEP_COLUMNS}

    def send(**extra: Any) -> int:
        header = {"job": "vj2", "host": "h0", "sent_ns": T0 + 1_000 * MS, "agent": "a",
                  "batch_seq": 0, "topology": digest, **extra}  # fmt: skip
        body = v2.encode(header, empty, steps)
        return client.post("/v2/ingest", content=body,
                           headers={"Content-Type": v2.MEDIA_TYPE}).status_code  # fmt: skip

    assert send(complete_ns=T0 + 2_000 * MS, inflight_after_ns=MS) == 400  # after sent_ns
    assert send(complete_ns=T0 + 700 * MS, inflight_after_ns=250 * MS) == 200
    h = host_of(client, "vj2")
    assert (h.complete_ns, h.inflight_after_ns) == (T0 + 700 * MS, 250 * MS)


def test_where_every_host_vouches_the_hang_detector_is_given_younger_collectives(
    client: TestClient,
) -> None:
    """``blocked_before_ns``: the configured floor (1 s) ago, or, where every host of the job
    vouches, its announced in-flight delay ago (0.25 s); one host that does not vouch keeps
    the floor (on 0.4 s steps a stopped rank was otherwise never judged before 1 s). The job
    view shows which hosts vouch."""
    from failslow.service.stream.shape import blocked_before_ns

    def post(host: int, **vouch: int) -> None:
        env = {**v1(**vouch), "job": "vb", "host": f"h{host}",
               "ranks": [{"rank": host, "world_size": 3}]}  # fmt: skip
        assert client.post("/v1/ingest", json=env).status_code == 200

    for host in (0, 1):
        post(host, complete_ns=T0 + 900 * MS, inflight_after_ns=250 * MS)
    state = client.app.state.ctx.jobs.get("vb")  # type: ignore[attr-defined]
    now = state.watermark_ns
    assert blocked_before_ns(state, 1.0) == now - 250 * MS
    assert blocked_before_ns(state, 0.1) == now - 100 * MS  # a smaller floor configured holds
    post(2)  # a host that does not vouch
    assert blocked_before_ns(state, 1.0) == state.watermark_ns - 1_000 * MS
    shown = client.get("/v1/jobs/vb").json()["detector"]["completeness"]  # for operators
    lag = round((state.watermark_ns - (T0 + 900 * MS)) / 1e9, 3)
    assert shown == {"vouching_hosts": 2, "hosts": 3, "inflight_after_s": 0.25,
                     "oldest_complete": {"host": "h0", "lag_s": lag},
                     "measured_inflight_delay_s": None,
                     "measured_delivery_lag_s": None}  # fmt: skip
