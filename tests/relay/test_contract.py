"""One ingest contract: every body case sent to the service directly and through a relay in
front of it gets the same answer (status, problem type, title, detail, errors). The relay
checks bodies with the service's own code (failslow.wire.body); before that, gzip followed by
garbage was refused by the service (400) and stored through the relay (200), and a body of
exactly the service's limit was taken by the service (200) and refused by the relay (413: its
bundle framing adds 12 bytes), which agents treat as never sendable (issue 31, case 7)."""

from __future__ import annotations

import gzip
from typing import Any

import httpx
import pytest

from failslow.service.settings import Settings
from failslow.wire import topology
from tests.helpers import MS, T0, two_hosts
from tests.live import live_service
from tests.relay.test_relay import _register, live_relay
from tests.service.ingest.test_ingest_v2 import HEADERS, envelope

GZ = {**HEADERS, "Content-Encoding": "gzip"}
K = 400  # records of the exact-limit body: its length is the limit of both


def _body(digest: str, seq: int, k: int = K) -> bytes:
    cols = {"rank": [0] * k, "seq": list(range(seq * k, (seq + 1) * k)),
            "start_ns": [T0] * k, "end_ns": [T0 + MS] * k}  # fmt: skip
    return envelope(digest, cols, seq=seq)


def _cases(d0: str) -> list[tuple[str, dict[str, str], bytes, int]]:
    """(name, headers, body, the status both must answer)."""
    limit = len(_body(d0, 0))
    z = gzip.compress
    return [
        ("exactly the limit", HEADERS, _body(d0, 1), 200),
        ("exactly the limit, gzip", GZ, z(_body(d0, 2)), 200),
        ("gzip then garbage", GZ, z(_body(d0, 3)) + b"garbage", 400),
        ("two gzip members", GZ, z(_body(d0, 4, 4)) + z(b"x"), 400),
        ("truncated gzip", GZ, z(_body(d0, 5))[:-9], 400),
        ("not gzip at all", GZ, b"\x1f\x8bnot gzip", 400),
        ("a gzip bomb", GZ, z(b"\0" * (64 * limit)), 413),
        ("one byte over", HEADERS, _body(d0, 6) + b"\0", 413),
        ("over once decompressed", GZ, z(_body(d0, 7, K + 1)), 413),
        ("json media type", {"Content-Type": "application/json"}, _body(d0, 8), 415),
        ("brotli", {**HEADERS, "Content-Encoding": "br"}, _body(d0, 9), 415),
        ("empty", HEADERS, b"", 400),
        ("not v2", HEADERS, b"FSL3" + bytes(60), 400),
        ("unknown digest", HEADERS, _body("0" * 16, 10, 4), 409),
        ("a bad record", HEADERS, envelope(d0, {"rank": [9], "seq": [0], "start_ns": [T0],
                                                 "end_ns": [T0 - 1]}, seq=11), 200),  # fmt: skip
    ]


def _fields(r: httpx.Response) -> dict[str, Any]:
    if r.status_code == 200:  # the second send of a batch is a duplicate: the counts add up
        j = r.json()
        return {"records": j["accepted"] + j["duplicates"] + len(j["rejected"])}
    assert r.headers["content-type"].startswith("application/problem+json"), r.headers
    j = r.json()
    return {k: j.get(k) for k in ("status", "type", "title", "detail", "errors")}


def test_the_relay_answers_every_body_as_the_service_does(settings: Settings) -> None:
    h0, _ = two_hosts()
    d0 = topology.digest(h0["ranks"], h0["comms"])
    limit = len(_body(d0, 0))
    ingest = settings.ingest.model_copy(update={"max_body_bytes": limit})
    cases = _cases(d0)
    with live_service(settings.model_copy(update={"ingest": ingest})) as svc:
        assert _register(svc)[0] == d0
        with live_relay(svc, max_wait_s=0.01, max_body_bytes=limit) as relay:
            got = {}
            for name, headers, body, _ in cases:
                direct = httpx.post(f"{svc}/v2/ingest", content=body, headers=headers)
                relayed = httpx.post(f"{relay}/v2/ingest", content=body, headers=headers)
                got[name] = (direct.status_code, relayed.status_code,
                             _fields(direct), _fields(relayed))  # fmt: skip
            status = httpx.get(f"{relay}/relayz").json()
    assert {n: g[0] for n, g in got.items()} == {c[0]: c[3] for c in cases}
    for name, (_, _, direct, relayed) in got.items():
        assert relayed == direct, name
    assert status["alone"] == 2, status  # the two exact-limit bodies: over the limit as bundles
    assert got["a bad record"][2]["records"] == 1


@pytest.mark.parametrize("cls", ["BadBody", "TooLarge", "BadMediaType"])
def test_the_wire_problems_are_the_services(cls: str) -> None:
    from failslow.service.ingest import decode
    from failslow.wire import body

    wire = getattr(body, cls)
    svc = decode._PROBLEMS[wire]
    assert (wire.status, wire.slug, wire.title) == (svc.status, svc.slug, svc.title)
