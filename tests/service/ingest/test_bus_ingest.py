"""Ingest with a bus (docs/replicas.md), through the real app on a real NATS JetStream server:
the envelope's own rules are answered as without a bus, accepted batches are queued, a re-sent
batch is answered as duplicates by JetStream, an unregistered v2 topology is 409, and the owner
applies what was queued (v1 and v2)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from failslow.service.app import create_app
from failslow.service.bus.client import partition_of
from failslow.service.bus.settings import BusSettings
from failslow.service.settings import DetectionSettings, Settings
from failslow.wire import v2
from tests.helpers import MS, T0, two_hosts
from tests.infra import nats as natsinfra
from tests.live import wait_for

HEADERS = {"Content-Type": v2.MEDIA_TYPE}


@pytest.fixture(scope="module")
def nats_url() -> Iterator[str]:
    why = natsinfra.unavailable()
    if why:
        pytest.skip(why)
    with natsinfra.cluster(1) as c:
        yield c.url


@pytest.fixture
def client(nats_url: str, tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path}/db.sqlite",
        detection=DetectionSettings(interval_s=0.05),
        bus=BusSettings(url=nats_url, stream=f"T{tmp_path.name[-8:]}".replace("-", "_"),
                        subject=f"t.{tmp_path.name[-8:]}".replace("-", "_"), owner_ttl_s=2,
                        partitions=2),  # fmt: skip
    )
    with TestClient(create_app(settings)) as c:
        assert wait_for(lambda: len(c.get("/v1/replica").json()["owned"]) == 2, timeout=15)
        assert wait_for(lambda: all(p["ready"] for p in c.get("/v1/replica").json()["owned"]
                                    .values()), timeout=15)  # fmt: skip
        yield c


def test_v1_and_v2_through_the_bus(client: TestClient) -> None:
    h0, h1 = two_hosts()
    # the envelope's own rules: answered at once, nothing queued
    bad = client.post("/v1/ingest", json={"job": "j", "sent_ns": -1})
    assert bad.status_code == 400 and bad.headers["content-type"] == "application/problem+json"
    env = {"job": "j", "host": "h0", "sent_ns": T0 + MS, "agent": "a0", "batch_seq": 1, **h0,
           "collectives": [{"rank": r, "comm": h0["comms"][0]["comm"], "seq": 0,
                            "op": "allreduce", "bytes": 8, "start_ns": T0 + r,
                            "end_ns": T0 + MS} for r in (0, 1)]}  # fmt: skip
    r = client.post("/v1/ingest", json=env)
    assert r.json() == {"accepted": 2, "duplicates": 0, "rejected": [], "queued": True}
    again = client.post("/v1/ingest", json=env)  # the same batch: JetStream holds it already
    assert again.json() == {"accepted": 0, "duplicates": 2, "rejected": [], "queued": True}
    # v2: an unregistered digest is 409; registered, it is queued and applied by the owner
    cols = {"rank": [2, 3], "comm": [0, 0], "seq": [0, 0], "op": [0, 0], "bytes": [8, 8],
            "start_ns": [T0 + 2, T0 + 3], "end_ns": [T0 + MS] * 2,
            "peer": [v2.NO_PEER] * 2}  # fmt: skip
    steps = {"rank": [], "step": [], "start_ns": [], "end_ns": []}

    def body(digest: str) -> bytes:
        header = {"job": "j", "host": "h1", "sent_ns": T0 + MS, "agent": "a1", "batch_seq": 1,
                  "topology": digest}  # fmt: skip
        return v2.encode(header, cols, steps)

    unknown = client.post("/v2/ingest", content=body("0" * 16), headers=HEADERS)
    assert unknown.status_code == 409
    reg = client.put("/v2/jobs/j/topology/h1", json={"sent_ns": T0, **h1})
    assert reg.status_code == 200, reg.text
    r = client.post("/v2/ingest", content=body(reg.json()["digest"]), headers=HEADERS)
    assert r.status_code == 200 and r.json()["queued"] is True and r.json()["accepted"] == 2

    def applied() -> dict | None:  # type: ignore[type-arg]
        d = client.get("/v1/jobs/j")
        return d.json() if d.status_code == 200 and len(d.json()["ingest"]) == 2 else None

    detail = wait_for(applied, timeout=15)
    assert detail, client.get("/v1/replica").json()
    assert detail["ingest"]["h0"]["accepted"] == 2 and detail["ingest"]["h1"]["accepted"] == 2
    assert detail["ingest"]["h0"]["duplicates"] == 0  # the re-send never reached the owner
    assert detail["detector"]["pending_collectives"] == 0  # joined across both hosts


def test_partitions_interleave_in_the_stream_without_loss(client: TestClient) -> None:
    """Jobs of both partitions alternate in one stream: the sequence gaps each owner sees are
    other partitions' messages, not losses."""
    h0, _ = two_hosts()
    jobs = ["j", next(j for j in (f"k{i}" for i in range(50)) if partition_of(j, 2) !=
                      partition_of("j", 2))]  # fmt: skip
    for seq in range(1, 6):
        for job in jobs:
            env = {"job": job, "host": "h0", "sent_ns": T0 + seq * MS, "agent": "a0",
                   "batch_seq": seq, **h0,
                   "steps": [{"rank": 0, "step": seq, "start_ns": T0 + (seq - 1) * MS,
                              "end_ns": T0 + seq * MS}]}  # fmt: skip
            assert client.post("/v1/ingest", json=env).json()["accepted"] == 1

    def counted() -> bool:
        got = [client.get(f"/v1/jobs/{j}") for j in jobs]
        return all(r.status_code == 200 and r.json()["ingest"]["h0"]["accepted"] == 5
                   for r in got)  # fmt: skip

    assert wait_for(counted, timeout=15)
    metrics = client.get("/metrics").text
    assert "failslow_bus_failed_total 0.0" in metrics
    assert "failslow_bus_expired_total 0.0" in metrics


def test_a_bundle_through_the_bus(client: TestClient) -> None:
    """``POST /v2/ingest/bundle`` with a bus: each body is published in bundle order (one
    agent's batches stay in order), answered queued or refused on its own, and applied by the
    owner once. (Job jb, agent b1: the streams of this module's tests may share a name.)"""
    _, h1 = two_hosts()
    digest = client.put("/v2/jobs/jb/topology/h1", json={"sent_ns": T0, **h1}).json()["digest"]
    steps = {"rank": [], "step": [], "start_ns": [], "end_ns": []}

    def body(seq: int, digest: str = digest) -> bytes:
        cols = {"rank": [2, 3], "comm": [0, 0], "seq": [seq] * 2, "op": [0, 0], "bytes": [8, 8],
                "start_ns": [T0 + seq * MS] * 2, "end_ns": [T0 + (seq + 1) * MS] * 2,
                "peer": [v2.NO_PEER] * 2}  # fmt: skip
        header = {"job": "jb", "host": "h1", "sent_ns": T0 + (seq + 1) * MS, "agent": "b1",
                  "batch_seq": seq, "topology": digest}  # fmt: skip
        return v2.encode(header, cols, steps)

    bundle = v2.encode_bundle([body(1), body(2), body(2), body(3, "0" * 16)])
    r = client.post("/v2/ingest/bundle", content=bundle,
                    headers={"Content-Type": v2.BUNDLE_MEDIA_TYPE})  # fmt: skip
    items = r.json()["items"]
    assert r.status_code == 200 and items[0] == items[1] == {
        "accepted": 2, "duplicates": 0, "rejected": [], "queued": True}  # fmt: skip
    assert items[2] == {"accepted": 0, "duplicates": 2, "rejected": [], "queued": True}
    assert items[3]["status"] == 409 and items[3]["type"].endswith("/unknown-topology")

    def applied() -> dict | None:  # type: ignore[type-arg]
        d = client.get("/v1/jobs/jb")
        return d.json() if d.status_code == 200 and "h1" in d.json()["ingest"] else None

    detail = wait_for(applied, timeout=15)
    assert detail and detail["ingest"]["h1"]["accepted"] == 4
    assert detail["ingest"]["h1"]["duplicates"] == 0  # the re-sent batch never reached the owner
