"""Ingest v2 through the real app: registration once, binary columns, the same partial acceptance
and problem+json rules as v1, and the same incidents as v1 for the same job."""

from __future__ import annotations

import gzip
from typing import Any

import pytest
from fastapi.testclient import TestClient

from failslow.harness.simulator import Fault, Layout, Scenario
from failslow.harness.v2 import V2Converter
from failslow.service.app import create_app
from failslow.service.auth import hash_token
from failslow.service.settings import Settings
from failslow.wire import topology, v2
from tests.helpers import MS, T0, two_hosts

HEADERS = {"Content-Type": v2.MEDIA_TYPE}


@pytest.fixture(params=["fast_path", "fastapi_route"])
def settings(settings: Settings, request: pytest.FixtureRequest) -> Settings:
    """Every test here runs through the ASGI fast path and through the FastAPI route."""
    ingest = settings.ingest.model_copy(update={"fast_path": request.param == "fast_path"})
    return settings.model_copy(update={"ingest": ingest})


def register(client: TestClient, host: str, ranks: list[Any], comms: list[Any], job: str = "j"):  # type: ignore[no-untyped-def]
    return client.put(
        f"/v2/jobs/{job}/topology/{host}", json={"sent_ns": T0, "ranks": ranks, "comms": comms}
    )


def envelope(digest: str, cols: dict[str, list[Any]], steps: dict[str, list[Any]] | None = None,
             *, seq: int = 0, host: str = "h0") -> bytes:  # fmt: skip
    header = {"job": "j", "host": host, "sent_ns": T0 + MS, "agent": f"{host}-a",
              "batch_seq": seq, "topology": digest}  # fmt: skip
    k = len(cols.get("rank", []))
    full = {"comm": [0] * k, "op": [0] * k, "bytes": [8] * k, "peer": [v2.NO_PEER] * k} | cols
    st = {"rank": [], "step": [], "start_ns": [], "end_ns": []} | (steps or {})
    return v2.encode(header, full, st)


def test_register_then_send_and_join_across_hosts(client: TestClient) -> None:
    h0, h1 = two_hosts()
    r = register(client, "h0", h0["ranks"], h0["comms"])
    assert r.status_code == 200, r.text
    d0 = r.json()["digest"]
    assert d0 == topology.digest(h0["ranks"], h0["comms"]) and r.json()["comms"] == 1
    d1 = register(client, "h1", h1["ranks"], h1["comms"]).json()["digest"]
    t = [T0, T0 + 1, T0 + 2, T0 + 3]
    cols = {"rank": [0, 1], "seq": [0, 0], "start_ns": t[:2], "end_ns": [T0 + MS] * 2}
    r = client.post("/v2/ingest", content=envelope(d0, cols), headers=HEADERS)
    assert r.status_code == 200 and r.json() == {"accepted": 2, "duplicates": 0, "rejected": []}
    cols = {"rank": [2, 3], "seq": [0, 0], "start_ns": t[2:], "end_ns": [T0 + MS] * 2}
    steps = {"rank": [2, 3], "step": [0, 0], "start_ns": [T0 - MS] * 2, "end_ns": [T0 + 2 * MS] * 2}
    body = gzip.compress(envelope(d1, cols, steps, host="h1"))
    r = client.post("/v2/ingest", content=body, headers={**HEADERS, "Content-Encoding": "gzip"})
    assert r.json()["accepted"] == 4
    again = client.post("/v2/ingest", content=body, headers={**HEADERS, "Content-Encoding": "gzip"})
    assert again.json() == {"accepted": 0, "duplicates": 4, "rejected": []}  # the same batch
    detail = client.get("/v1/jobs/j").json()
    assert detail["detector"]["pending_collectives"] == 0  # joined across both hosts
    assert detail["ingest"]["h1"]["accepted"] == 4 and detail["ingest"]["h1"]["duplicates"] == 4


def test_bad_records_are_rejected_one_by_one(client: TestClient) -> None:
    h0, _ = two_hosts()
    p2p = {"comm": "p-01", "kind": "p2p", "ranks": [0, 1]}
    d = register(client, "h0", h0["ranks"], [*h0["comms"], p2p]).json()["digest"]
    cols = {
        "rank": [0, 7, 0, 0, 0, 0, 0, 1],
        "comm": [0, 0, 5, 0, 0, 0, 1, 1],
        "seq": [0, 0, 0, -1, 0, 0, 0, 0],
        "op": [0, 0, 0, 0, 99, 0, 7, 8],
        "start_ns": [T0] * 8,
        "end_ns": [T0 + 1, T0 + 1, T0 + 1, T0 + 1, T0 + 1, T0 - 1, T0 + 1, T0 + 1],
        "peer": [-1, -1, -1, -1, -1, -1, 1, 3],
        "bytes": [8] * 8,
    }
    r = client.post("/v2/ingest", content=envelope(d, cols), headers=HEADERS).json()
    assert r["accepted"] == 2  # the first one, and the send to 1
    assert [x["index"] for x in r["rejected"]] == [f"collectives[{i}]" for i in (1, 2, 3, 4, 5, 7)]
    reasons = [x["reason"] for x in r["rejected"]]
    assert "registered ranks" in reasons[0] and "comm code" in reasons[1]
    assert "seq" in reasons[2] and "op" in reasons[3] and "before" in reasons[4]
    assert "peer" in reasons[5]


def test_unknown_topology_is_409_and_registration_is_all_or_nothing(client: TestClient) -> None:
    h0, _ = two_hosts()
    r = client.post("/v2/ingest", content=envelope("0" * 16, {"rank": []}), headers=HEADERS)
    assert r.status_code == 409
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["type"].endswith("/unknown-topology")
    register(client, "h0", h0["ranks"], h0["comms"])
    clash = {"comm": "dp-0", "kind": "dp", "ranks": [3, 2, 1, 0]}  # dp-0 exists with 0..3
    fresh = {"comm": "tp-9", "kind": "tp", "ranks": [0, 1]}
    r = register(client, "h0", h0["ranks"], [fresh, clash])
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == "comms[1]"
    assert client.get("/v1/jobs/j").json()["comms"] == 1  # tp-9 was not registered either


def test_a_host_whose_ranks_moved_and_came_back_keeps_its_data(client: TestClient) -> None:
    """h1 registers ranks 0 and 1, h2 the same ranks (a restart reshuffled hosts), then h1
    again: its registration is applied again (the ranks are h1's), not merely answered 200."""
    h0, _ = two_hosts()
    d1 = register(client, "h1", h0["ranks"], h0["comms"]).json()["digest"]
    d2 = register(client, "h2", h0["ranks"], h0["comms"]).json()["digest"]
    cols = {"rank": [0, 1], "seq": [0, 0], "start_ns": [T0, T0], "end_ns": [T0 + MS] * 2}

    def send(host: str, digest: str, seq: int) -> Any:
        c = {**cols, "seq": [seq, seq]}
        return client.post("/v2/ingest", content=envelope(digest, c, seq=seq, host=host),
                           headers=HEADERS)  # fmt: skip

    assert send("h2", d2, 0).json()["accepted"] == 2
    # h1 sends under its old digest: a 409 that makes its agent register again, not a 200
    # whose every record is rejected "rank now lives on another host"
    stale = send("h1", d1, 1)
    assert stale.status_code == 409 and "another host" in stale.text
    again = register(client, "h1", h0["ranks"], h0["comms"])
    assert again.status_code == 200 and again.json()["digest"] == d1
    back = send("h1", d1, 2)
    assert back.status_code == 200 and back.json() == {"accepted": 2, "duplicates": 0,
                                                       "rejected": []}  # fmt: skip
    assert send("h2", d2, 3).status_code == 409  # now h2's registration is the stale one
    assert client.get("/v1/jobs/j").json()["ingest"]["h1"]["accepted"] == 2


@pytest.mark.parametrize(
    "body,headers,status",
    [
        (b"FSL2junk", HEADERS, 400),
        (b"{}", {"Content-Type": "application/json"}, 415),
        (v2.encode({"job": "a/b", "host": "h0", "sent_ns": 1, "agent": "a", "batch_seq": 0,
                    "topology": "x"}, {}, {}), HEADERS, 400),  # fmt: skip
        (v2.encode({"job": "j", "host": "h0", "sent_ns": 1, "topology": "x"},
                   {"rank": [0], "comm": [0], "seq": [0], "op": [0], "bytes": [1],
                    "start_ns": [1], "end_ns": [2], "peer": [-1]}, {}),
         HEADERS, 400),  # records need agent and batch_seq  # fmt: skip
    ],
)
def test_malformed_envelopes(
    client: TestClient, body: bytes, headers: dict[str, str], status: int
) -> None:
    r = client.post("/v2/ingest", content=body, headers=headers)
    assert r.status_code == status
    assert r.headers["content-type"] == "application/problem+json"


def _incidents(client: TestClient, job: str) -> list[tuple[Any, ...]]:
    client.post(f"/v1/jobs/{job}/flush")
    return sorted(
        (i["kind"], tuple(i["ranks"]), tuple(i["hosts"]), i["onset_step"], i["detected_step"])
        for i in client.get(f"/v1/jobs/{job}/incidents").json()
    )


def test_v2_finds_what_v1_finds(client: TestClient) -> None:
    layout = Layout(tp=2, pp=2, dp=4, gpus_per_host=4)
    fault = Fault("slow_gpu", 40, factor=1.5, ranks=(5,))
    conv = V2Converter()
    for job in ("via-v1", "via-v2"):
        for env in Scenario(job=job, layout=layout, steps=90, faults=(fault,), seed=2).envelopes():
            if job == "via-v1":
                assert client.post("/v1/ingest", json=env).status_code == 200
                continue
            c = conv.convert(env)
            if c.registration is not None:
                assert client.put(f"/v2/jobs/{job}/topology/{c.host}", json=c.registration).json()
            r = client.post("/v2/ingest", content=c.body, headers=HEADERS)
            assert r.status_code == 200 and not r.json()["rejected"], r.text
    v1, v2_ = _incidents(client, "via-v1"), _incidents(client, "via-v2")
    assert v1 == v2_ and [i[:2] for i in v1] == [("slow_gpu", (5,))]


def test_the_fast_path_answers_auth_and_errors_like_the_route(
    settings: Settings, tmp_path: Any
) -> None:
    auth = settings.auth.model_copy(update={"ingest_tokens": [hash_token("in")]})
    with TestClient(create_app(settings.model_copy(update={"auth": auth}))) as c:
        r = c.post("/v2/ingest", content=b"FSL2", headers=HEADERS)
        assert r.status_code == 401 and r.headers["content-type"] == "application/problem+json"
        assert r.json()["instance"] == "/v2/ingest"
        good = {**HEADERS, "Authorization": "Bearer in"}
        r = c.post("/v2/ingest", content=b"nope", headers=good)
        assert r.status_code == 400 and r.json()["type"].endswith("/invalid-envelope")
        r = c.post("/v2/ingest", content=b"x", headers={**good, "Content-Type": "text/plain"})
        assert r.status_code == 415
        assert c.get("/v2/ingest").status_code == 405  # other methods reach the router


def test_a_comm_may_be_registered_as_a_range(client: TestClient) -> None:
    ranks = [{"rank": r, "gpu": r, "world_size": 8} for r in range(4)]
    world = {"comm": "w", "kind": "world", "ranks": {"start": 0, "stop": 8}}
    r = register(client, "h0", ranks, [world])
    assert r.status_code == 200, r.text
    as_list = {**world, "ranks": list(range(8))}
    assert r.json()["digest"] == topology.digest(ranks, [as_list])
    again = register(client, "h1", [{"rank": 4, "gpu": 0}], [as_list])  # the same comm, as a list
    assert again.status_code == 200
    clash = register(client, "h1", [{"rank": 4, "gpu": 0}],
                     [{**world, "ranks": {"start": 0, "stop": 8, "step": 2}}])  # fmt: skip
    assert clash.status_code == 422 and "conflicting" in clash.text
    bad = register(client, "h2", [], [{**world, "comm": "x", "ranks": {"start": 0, "stop": -1}}])
    assert bad.status_code == 422 and "range" in bad.text


@pytest.mark.parametrize("stop", [2**63, 2**64 - 1])
def test_a_range_past_int64_is_422(client: TestClient, stop: int) -> None:
    """``len(range)`` of such a range overflows (it was a 500 with a traceback)."""
    ranks = [{"rank": 0, "gpu": 0, "world_size": 2}]
    comm = {"comm": "w", "kind": "world", "ranks": {"start": 0, "stop": stop, "step": 2**40}}
    r = register(client, "h0", ranks, [comm])
    assert r.status_code == 422, r.text
    assert "at most" in r.text and r.headers["content-type"].startswith("application/problem")


@pytest.mark.both_databases
def test_registrations_survive_a_restart(settings: Settings) -> None:
    """A restarted service resolves the digests its hosts registered before (no 409 storm):
    the newest four per host, as in memory."""
    h0, _ = two_hosts()
    cols = {"rank": [0, 1], "seq": [0, 0], "start_ns": [T0, T0 + 1], "end_ns": [T0 + MS] * 2}
    digests = []
    with TestClient(create_app(settings)) as c:
        for i in range(5):  # five topologies of h0 (an extra comm each): the first is forgotten
            extra = {"comm": f"x-{i}", "kind": "tp", "ranks": [0, 1]}
            r = register(c, "h0", h0["ranks"], [*h0["comms"], extra])
            assert r.status_code == 200, r.text
            digests.append(r.json()["digest"])
        assert c.post("/v2/ingest", content=envelope(digests[-1], cols), headers=HEADERS).json()[
            "accepted"] == 2  # fmt: skip
    with TestClient(create_app(settings)) as c:
        seq = 1
        for d in digests[1:]:  # each kept topology resolves with its own comm codes
            cols = {**cols, "seq": [seq, seq], "comm": [1, 1]}
            r = c.post("/v2/ingest", content=envelope(d, cols, seq=seq), headers=HEADERS)
            assert r.status_code == 200 and r.json()["accepted"] == 2, r.text
            seq += 1
        r = c.post("/v2/ingest", content=envelope(digests[0], cols, seq=seq), headers=HEADERS)
        assert r.status_code == 409, r.text
        # a registration after the restart is stored too, and evicts the oldest kept one
        extra = {"comm": "x-5", "kind": "tp", "ranks": [0, 1]}
        d5 = register(c, "h0", h0["ranks"], [*h0["comms"], extra]).json()["digest"]
    with TestClient(create_app(settings)) as c:
        ok = [d5, *digests[2:]]
        for d in ok:
            cols = {**cols, "seq": [seq, seq], "comm": [1, 1]}
            r = c.post("/v2/ingest", content=envelope(d, cols, seq=seq), headers=HEADERS)
            assert r.status_code == 200, r.text
            seq += 1
        r = c.post("/v2/ingest", content=envelope(digests[1], cols, seq=seq), headers=HEADERS)
        assert r.status_code == 409, r.text
