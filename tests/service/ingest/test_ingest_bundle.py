"""``POST /v2/ingest/bundle`` through the real app: each body of a bundle is answered exactly as
if it had been sent alone to ``POST /v2/ingest`` (results, refusals with their problem, counters),
in bundle order; only a bundle whose framing, media type or token is wrong is refused whole."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from failslow.service.app import create_app
from failslow.service.auth import hash_token
from failslow.service.settings import Settings
from failslow.wire import v2
from tests.helpers import MS, T0, two_hosts
from tests.service.ingest.test_ingest_v2 import HEADERS, envelope, register

BUNDLE = {"Content-Type": v2.BUNDLE_MEDIA_TYPE}


@pytest.fixture(params=["fast_path", "fastapi_route"])
def settings(settings: Settings, request: pytest.FixtureRequest) -> Settings:
    """Every test here runs through the ASGI fast path and through the FastAPI route."""
    ingest = settings.ingest.model_copy(update={"fast_path": request.param == "fast_path"})
    return settings.model_copy(update={"ingest": ingest})


def _bodies(client: TestClient) -> list[bytes]:
    """Registers two hosts of job j; :func:`mixed_bodies` of them."""
    h0, h1 = two_hosts()
    d0 = register(client, "h0", h0["ranks"], h0["comms"]).json()["digest"]
    d1 = register(client, "h1", h1["ranks"], h1["comms"]).json()["digest"]
    return mixed_bodies(d0, d1)


def mixed_bodies(d0: str, d1: str) -> list[bytes]:
    """A mixed bag of bodies for hosts h0 and h1 of job j (registered as ``d0``, ``d1``): good
    ones of both hosts, a re-send, a bad record, an unknown digest, a bad header, and one of job
    other (out of a scoped token)."""
    t = [T0, T0 + 1, T0 + 2, T0 + 3]
    a = envelope(d0, {"rank": [0, 1], "seq": [0, 0], "start_ns": t[:2], "end_ns": [T0 + MS] * 2})
    b = envelope(d1, {"rank": [2, 3], "seq": [0, 0], "start_ns": t[2:], "end_ns": [T0 + MS] * 2},
                 host="h1")  # fmt: skip
    bad_record = envelope(d0, {"rank": [0, 9], "seq": [1, 1], "start_ns": t[:2],
                               "end_ns": [T0 + MS] * 2}, seq=1)  # fmt: skip
    unknown = envelope("0" * 16, {"rank": []}, host="h1", seq=1)
    bad_header = v2.encode({"job": "a/b", "host": "h0", "sent_ns": 1, "agent": "a",
                            "batch_seq": 0, "topology": "x"}, {}, {})  # fmt: skip
    other = v2.encode({"job": "other", "host": "h0", "sent_ns": T0, "agent": "h0-a",
                       "batch_seq": 0, "topology": d0}, {}, {})  # fmt: skip
    return [a, b, a, bad_record, unknown, bad_header, other]


def _status(item: dict[str, Any]) -> int:
    return int(item.get("status", 200))


def test_each_body_is_answered_as_if_it_came_alone(settings: Settings, tmp_path: Path) -> None:
    """The same bodies through the bundle and one by one (each on a service of its own): the
    same answers in the same order and the same per-host counters."""
    with TestClient(create_app(settings)) as c:
        bodies = _bodies(c)
        r = c.post("/v2/ingest/bundle", headers=BUNDLE, content=v2.encode_bundle(bodies))
        assert r.status_code == 200, r.text
        items = r.json()["items"]
        bundled_hosts = c.get("/v1/jobs/j").json()["ingest"]
    singles: list[dict[str, Any]] = []
    alone_db = f"sqlite:///{tmp_path}/alone.db"
    with TestClient(create_app(settings.model_copy(update={"database_url": alone_db}))) as c:
        for body in _bodies(c):
            r = c.post("/v2/ingest", headers=HEADERS, content=body)
            singles.append(r.json() | ({"status": r.status_code} if r.status_code != 200 else {}))
        single_hosts = c.get("/v1/jobs/j").json()["ingest"]
    assert [_status(i) for i in items] == [200, 200, 200, 200, 409, 400, 409]
    for got, alone in zip(items, singles, strict=True):
        if _status(alone) == 200:
            assert got == alone
        else:  # the problem's fields, without the request path it was answered on
            assert {k: got.get(k) for k in ("status", "type", "title", "detail", "errors")} == {
                k: alone.get(k) for k in ("status", "type", "title", "detail", "errors")}
    assert items[0] == {"accepted": 2, "duplicates": 0, "rejected": []}
    assert items[2] == {"accepted": 0, "duplicates": 2, "rejected": []}  # the re-send, in order
    assert items[3]["accepted"] == 1 and items[3]["rejected"][0]["index"] == "collectives[1]"
    assert items[4]["type"].endswith("/unknown-topology")
    assert bundled_hosts == single_hosts
    assert bundled_hosts["h0"]["accepted"] == 3 and bundled_hosts["h0"]["duplicates"] == 2


def test_a_scoped_token_is_checked_per_body_and_the_bundle_whole(settings: Settings) -> None:
    auth = settings.auth.model_copy(update={"ingest_scopes": {hash_token("team"): ["j"]},
                                            "read_tokens": [hash_token("r")]})  # fmt: skip
    with TestClient(create_app(settings.model_copy(update={"auth": auth}))) as c:
        good = {**BUNDLE, "Authorization": "Bearer team"}
        c.headers["Authorization"] = "Bearer team"
        bodies = _bodies(c)
        gz = gzip.compress(v2.encode_bundle(bodies))
        r = c.post("/v2/ingest/bundle", headers={**good, "Content-Encoding": "gzip"}, content=gz)
        items = r.json()["items"]
        assert r.status_code == 200 and _status(items[0]) == 200
        assert items[-1]["status"] == 403 and items[-1]["type"].endswith("/forbidden")
        r = c.post("/v2/ingest/bundle", headers={**BUNDLE, "Authorization": "Bearer r"},
                   content=v2.encode_bundle(bodies[:1]))  # fmt: skip
        assert r.status_code == 403  # a read token may not ingest at all
        del c.headers["Authorization"]
        r = c.post("/v2/ingest/bundle", headers=BUNDLE, content=v2.encode_bundle(bodies[:1]))
        assert r.status_code == 401 and r.headers["content-type"] == "application/problem+json"


@pytest.mark.parametrize(
    "body,headers,status",
    [
        (b"FSLBjunk", BUNDLE, 400),
        (b"FSLB" + (2).to_bytes(4, "little") + (3).to_bytes(4, "little") + b"abc", BUNDLE, 400),
        (b"FSLB" + (1).to_bytes(4, "little") + (3).to_bytes(4, "little") + b"abcd", BUNDLE, 400),
        (b"FSLB" + (0).to_bytes(4, "little"), BUNDLE, 400),
        (v2.encode_bundle([b"x"]), HEADERS, 415),  # a bundle sent as one envelope's type
    ],
)
def test_a_bundle_with_bad_framing_is_refused_whole(
    client: TestClient, body: bytes, headers: dict[str, str], status: int
) -> None:
    r = client.post("/v2/ingest/bundle", headers=headers, content=body)
    assert r.status_code == status and r.headers["content-type"] == "application/problem+json"
    assert r.json()["instance"] == "/v2/ingest/bundle"


def test_a_body_that_is_not_v2_is_refused_alone(client: TestClient) -> None:
    h0, _ = two_hosts()
    d0 = register(client, "h0", h0["ranks"], h0["comms"]).json()["digest"]
    good = envelope(d0, {"rank": [0], "seq": [0], "start_ns": [T0], "end_ns": [T0 + MS]})
    r = client.post("/v2/ingest/bundle", headers=BUNDLE,
                    content=v2.encode_bundle([b"FSL2junk", good]))  # fmt: skip
    items = r.json()["items"]
    assert items[0]["status"] == 400 and items[0]["type"].endswith("/invalid-envelope")
    assert items[1] == {"accepted": 1, "duplicates": 0, "rejected": []}


def test_framing_round_trips_and_refuses_what_does_not_fit() -> None:
    bodies = [b"", b"a", b"x" * 1000]
    assert v2.decode_bundle(v2.encode_bundle(bodies)) == bodies
    with pytest.raises(ValueError):
        v2.encode_bundle([])
    with pytest.raises(v2.FormatError):
        v2.decode_bundle(v2.encode_bundle(bodies) + b"!")
    with pytest.raises(v2.FormatError):
        v2.decode_bundle(v2.encode_bundle(bodies)[:-1])
