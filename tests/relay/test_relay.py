"""The relay between real servers: a real service (uvicorn, SQLite) and a real relay in front of
it. Agents' envelopes sent to the relay at once go to the service as one bundle, and each agent
gets the answer the service would have given it alone; registrations and reads pass through;
whatever goes wrong upstream becomes an answer agents retry, and nothing is lost."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from failslow.agents.transport import Sender
from failslow.relay.app import RelayApp
from failslow.relay.batcher import RelaySettings
from failslow.service.auth import hash_token
from failslow.service.settings import Settings
from failslow.wire import v2
from tests.helpers import MS, T0, two_hosts
from tests.live import free_port, live_app, live_service
from tests.service.ingest.test_ingest_bundle import mixed_bodies
from tests.service.ingest.test_ingest_v2 import HEADERS, envelope


@contextmanager
def live_relay(upstream: str, **kw: Any) -> Iterator[str]:
    with live_app(RelayApp(RelaySettings(upstream=upstream, **kw)), "/relayz") as url:
        yield url


def _register(url: str, headers: dict[str, str] | None = None) -> tuple[str, str]:
    h0, h1 = two_hosts()
    digests = []
    for host, h in (("h0", h0), ("h1", h1)):
        r = httpx.put(f"{url}/v2/jobs/j/topology/{host}", headers=headers,
                      json={"sent_ns": T0, "ranks": h["ranks"], "comms": h["comms"]})  # fmt: skip
        assert r.status_code == 200, r.text
        digests.append(r.json()["digest"])
    return digests[0], digests[1]


def _send_at_once(url: str, bodies: list[bytes], headers: list[dict[str, str]]) -> list[Any]:
    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as c:
            sends = [c.post(f"{url}/v2/ingest", content=b, headers=h)
                     for b, h in zip(bodies, headers, strict=True)]  # fmt: skip
            return await asyncio.gather(*sends)

    return asyncio.run(go())


def test_agents_sent_at_once_are_one_bundle_and_each_gets_its_own_answer(
    settings: Settings,
) -> None:
    with live_service(settings) as svc:
        # what the service answers each body alone: the reference
        d0, d1 = _register(svc)
        alone = [httpx.post(f"{svc}/v2/ingest", content=b, headers=HEADERS)
                 for b in mixed_bodies(d0, d1)]  # fmt: skip
        with live_relay(svc, max_wait_s=0.5) as relay:
            d0r, d1r = _register(relay)  # passed through: the same registration, the same digest
            assert (d0r, d1r) == (d0, d1)
            bodies = mixed_bodies(d0, d1)
            got = _send_at_once(relay, bodies, [HEADERS] * len(bodies))
            status = httpx.get(f"{relay}/relayz").json()
            jobs = httpx.get(f"{relay}/v1/jobs/j").json()  # a read, passed through
            metrics = httpx.get(f"{relay}/metrics").text
    assert [r.status_code for r in got] == [r.status_code for r in alone]
    assert [r.status_code for r in got] == [200, 200, 200, 200, 409, 400, 409]
    for r, ref in zip(got, alone, strict=True):
        if r.status_code == 200:  # the first time alone, a re-send through the relay
            assert set(r.json()) == {"accepted", "duplicates", "rejected"}
        else:
            assert r.headers["content-type"] == "application/problem+json"
            keys = ("status", "type", "title", "detail", "errors")
            assert {k: r.json().get(k) for k in keys} == {k: ref.json().get(k) for k in keys}
    assert got[0].json() == got[2].json() == {"accepted": 0, "duplicates": 2, "rejected": []}
    assert alone[3].json()["rejected"][0]["index"] == "collectives[1]"
    assert got[3].json() == {"accepted": 0, "duplicates": 2, "rejected": []}  # a re-sent batch
    assert status["bundles"] == 1, status  # seven agents at once: one request to the service
    assert status["bodies"]["accepted"] == 4 and status["bodies"]["refused"] == 3
    assert status["queued_bytes"] == 0 and status["in_flight"] == 0
    assert jobs["ingest"]["h0"]["duplicates"] == 8  # alone: a again (2); relayed: a x 2 and
    # bad_record (2 each)
    assert 'failslow_relay_bodies_total{outcome="accepted"} 4.0' in metrics


def test_a_real_agent_sender_registers_sends_gzip_and_re_registers_through_the_relay(
    settings: Settings,
) -> None:
    h0, _ = two_hosts()
    with live_service(settings) as svc, live_relay(svc, max_wait_s=0.01) as relay:
        sender = Sender(relay)
        try:
            body = envelope("0" * 16, {"rank": []})
            first = sender.post(gzip.compress(body), v2=True)  # gzip as agents send; unknown
            assert first.outcome == "unknown-topology", first
            reg = sender.register("j", "h0", {"sent_ns": T0, **h0})
            assert reg.outcome == "ok", reg
            d0 = reg.body["digest"]  # type: ignore[index]
            cols = {"rank": [0, 1], "seq": [0, 0], "start_ns": [T0, T0 + 1],
                    "end_ns": [T0 + MS] * 2}  # fmt: skip
            ok = sender.post(gzip.compress(envelope(d0, cols)), v2=True)
            assert ok.outcome == "ok" and ok.body == {"accepted": 2, "duplicates": 0,
                                                      "rejected": []}  # fmt: skip
        finally:
            sender.close()
        assert httpx.get(f"{svc}/v1/jobs/j").json()["ingest"]["h0"]["accepted"] == 2


def test_with_the_service_away_agents_are_told_to_retry_and_nothing_is_lost(
    settings: Settings,
) -> None:
    port = free_port()  # nothing listens here yet
    with live_relay(f"http://127.0.0.1:{port}", max_wait_s=0.01, timeout_s=5) as relay:
        r = httpx.post(f"{relay}/v2/ingest", content=envelope("0" * 16, {"rank": []}),
                       headers=HEADERS)  # fmt: skip
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["type"].endswith("/unavailable")
        h0, _ = two_hosts()
        sender = Sender(relay)
        reg = sender.register("j", "h0", {"sent_ns": T0, **h0})
        sender.close()
        assert reg.outcome == "retry" and reg.status == 503  # the agent keeps it and retries
        with live_service(settings, port=port):
            d0, _ = _register(relay)
            cols = {"rank": [0], "seq": [0], "start_ns": [T0], "end_ns": [T0 + MS]}
            r = httpx.post(f"{relay}/v2/ingest", content=envelope(d0, cols), headers=HEADERS)
            assert r.status_code == 200 and r.json()["accepted"] == 1
        assert httpx.get(f"{relay}/relayz").json()["bodies"]["unreachable"] == 1


def test_a_bundle_too_large_for_the_service_is_split_and_only_a_body_too_large_fails(
    settings: Settings,
) -> None:
    small = settings.model_copy(
        update={"ingest": settings.ingest.model_copy(update={"max_body_bytes": 4000})}
    )
    with live_service(small) as svc, live_relay(svc, max_wait_s=0.5) as relay:
        d0, d1 = _register(relay)
        bodies = []
        for i in range(8):  # ~1 KB each, from 8 agents (split halves go out concurrently)
            k = 16
            cols = {"rank": [i % 2] * k, "seq": list(range(i * k, (i + 1) * k)),
                    "start_ns": [T0] * k, "end_ns": [T0 + MS] * k}  # fmt: skip
            header = {"job": "j", "host": "h0", "sent_ns": T0 + MS, "agent": f"h0-a{i}",
                      "batch_seq": 0, "topology": d0}  # fmt: skip
            full = {"comm": [0] * k, "op": [0] * k, "bytes": [8] * k, "peer": [v2.NO_PEER] * k}
            steps = {"rank": [], "step": [], "start_ns": [], "end_ns": []}
            bodies.append(v2.encode(header, full | cols, steps))
        huge = envelope(d1, {"rank": [2] * 200, "seq": list(range(200)), "start_ns": [T0] * 200,
                             "end_ns": [T0 + MS] * 200}, host="h1")  # fmt: skip
        assert all(len(b) < 4000 for b in bodies) and len(b"".join(bodies)) > 4000
        assert len(huge) > 4000
        got = _send_at_once(relay, [*bodies, huge], [HEADERS] * 9)
        status = httpx.get(f"{relay}/relayz").json()
    assert [r.status_code for r in got] == [200] * 8 + [413]
    assert all(r.json() == {"accepted": 16, "duplicates": 0, "rejected": []} for r in got[:8])
    assert status["splits"] >= 2, status


def test_tokens_are_kept_apart_and_the_relays_own_limits_answer_clearly(
    settings: Settings,
) -> None:
    auth = settings.auth.model_copy(update={"ingest_scopes": {hash_token("team"): ["j"]}})
    with live_service(settings.model_copy(update={"auth": auth})) as svc:
        team = {"Authorization": "Bearer team"}
        with live_relay(svc, max_wait_s=0.3) as relay:
            d0, d1 = _register(relay, team)
            bodies = mixed_bodies(d0, d1)
            wrong = {**HEADERS, "Authorization": "Bearer nobody"}
            got = _send_at_once(relay, [bodies[0], bodies[-1], bodies[1]],
                                [{**HEADERS, **team}, {**HEADERS, **team}, wrong])  # fmt: skip
            assert [r.status_code for r in got] == [200, 403, 401]  # scope per body; 401 whole
            assert httpx.get(f"{relay}/relayz").json()["bundles"] == 2  # one per token
            gz = {**HEADERS, **team, "Content-Encoding": "gzip"}
            r = httpx.post(f"{relay}/v2/ingest", content=gzip.compress(bodies[1]), headers=gz)
            assert r.status_code == 200 and r.json()["accepted"] == 2
            for content, headers, code in [
                (bodies[0], {"Content-Type": "application/json", **team}, 415),
                (b"\x1f\x8bnot gzip", gz, 400),
            ]:
                r = httpx.post(f"{relay}/v2/ingest", content=content, headers=headers)
                assert r.status_code == code and r.headers["content-type"].startswith(
                    "application/problem+json")  # fmt: skip
        with live_relay(svc, max_queued_bytes=100) as relay:  # its own queue full: 429
            r = httpx.post(f"{relay}/v2/ingest", content=bodies[0], headers={**HEADERS, **team})
            assert r.status_code == 429 and r.headers["retry-after"] == "1"
            assert httpx.get(f"{relay}/relayz").json()["bodies"]["busy"] == 1


class _SlowUpstream:
    """An upstream that holds each PUT 0.3 s and counts how many it holds at once."""

    def __init__(self) -> None:
        self.now = self.peak = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] == "PUT":
            self.now += 1
            self.peak = max(self.peak, self.now)
            await asyncio.sleep(0.3)
            self.now -= 1
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})  # fmt: skip
        await send({"type": "http.response.body", "body": b"{}"})


@pytest.mark.parametrize("limit", [3, 12])
def test_registrations_pass_on_as_many_at_once_as_max_passthrough(limit: int) -> None:
    upstream = _SlowUpstream()

    async def register_all(relay: str) -> list[int]:
        async with httpx.AsyncClient(timeout=30) as c:
            puts = [c.put(f"{relay}/v2/jobs/j/topology/h{i}", json={}) for i in range(16)]
            return [r.status_code for r in await asyncio.gather(*puts)]

    with live_app(upstream, "/") as svc, live_relay(svc, max_passthrough=limit) as relay:
        assert asyncio.run(register_all(relay)) == [200] * 16
    assert upstream.peak == limit


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="max_bundle"):
        RelaySettings(upstream="http://x", max_bundle=0)
    with pytest.raises(ValueError, match="http"):
        RelaySettings(upstream="x:8000")
    with pytest.raises(ValueError, match="max_passthrough"):
        RelaySettings(upstream="http://x", max_passthrough=0)
