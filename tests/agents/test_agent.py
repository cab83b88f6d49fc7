"""The node agent against a real service: delivery, outages, restarts, refusals, lost answers."""

from __future__ import annotations

import gzip
import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from failslow.agents.agent import NodeAgent
from failslow.agents.sdk import Recorder
from failslow.service.settings import Settings
from tests.live import free_port, live_service, wait_for

JOB = "agent-job"
_made: list[NodeAgent] = []


@pytest.fixture(autouse=True)
def _no_agent_outlives_its_test() -> Iterator[None]:
    # A test that fails before agent.stop() left its sender retrying for the rest of the suite.
    yield
    while _made:
        agent = _made.pop()
        agent._stop.set()
        for t in agent._threads:
            t.join(timeout=3.0)


def make_agent(tmp_path: Path, url: str, **kw: object) -> NodeAgent:
    args: dict[str, object] = dict(
        service=url,
        job=JOB,
        host="h0",
        socket_path=str(tmp_path / "a.sock"),
        state_dir=str(tmp_path / "state"),
        flush_interval_s=0.1,
        heartbeat_s=0.5,
        fsync=False,
        backoff_cap_s=0.3,
    )
    args.update(kw)
    agent = NodeAgent(**args)  # type: ignore[arg-type]
    _made.append(agent)
    return agent


def feed(rec: Recorder, n: int, *, first: int = 0) -> None:
    rec.register_rank(0, gpu=0, world_size=2)
    rec.register_rank(1, gpu=1, world_size=2)
    rec.register_comm("dp", "dp", [0, 1])
    now = time.time_ns()  # one clock for records and envelopes, as in real use
    for i in range(first, first + n):
        for r in (0, 1):
            rec.record_collective(
                rank=r,
                comm="dp",
                seq=i,
                op="allreduce",
                nbytes=4,
                start_ns=now + i * 1000,
                end_ns=now + i * 1000 + 500,
            )


def accepted_on_service(url: str) -> int:
    r = httpx.get(f"{url}/v1/jobs/{JOB}")
    return sum(h["accepted"] for h in r.json()["ingest"].values()) if r.status_code == 200 else 0


@pytest.fixture
def settings_(db_url: str) -> Settings:
    return Settings(database_url=db_url)


def test_sdk_to_agent_to_service(tmp_path: Path, settings_: Settings) -> None:
    with live_service(settings_) as url:
        agent = make_agent(tmp_path, url)
        agent.start()
        rec = Recorder(JOB, socket_path=str(tmp_path / "a.sock"), flush_interval_s=0.01)
        feed(rec, 2000)
        assert rec.flush(timeout_s=30), rec.stats
        assert wait_for(lambda: accepted_on_service(url) == 4000, timeout=60), (
            accepted_on_service(url),
            agent.stats,
        )
        agent.stop()
        rec.close()
        assert agent.stats.records_in == 4000 and agent.stats.records_accepted == 4000
        assert agent.stats.records_duplicate == 0 and agent.stats.records_rejected == 0


def test_archive_keeps_every_delivered_envelope_for_replay(
    tmp_path: Path, settings_: Settings
) -> None:
    archive = tmp_path / "sent.jsonl"
    with live_service(settings_) as url:
        agent = make_agent(tmp_path, url, archive=str(archive))
        agent.start()
        rec = Recorder(JOB, socket_path=str(tmp_path / "a.sock"), flush_interval_s=0.01)
        feed(rec, 300)
        assert rec.flush(timeout_s=30)
        assert wait_for(lambda: accepted_on_service(url) == 600, timeout=60)
        agent.stop()
        rec.close()
    envelopes = [orjson.loads(line) for line in archive.read_bytes().splitlines()]
    assert len(envelopes) == agent.stats.envelopes_sent
    assert sum(len(e.get("collectives", [])) for e in envelopes) == 600
    seqs = [e["batch_seq"] for e in envelopes]
    assert seqs == sorted(seqs) and all(e["job"] == JOB for e in envelopes)


def test_service_outage_loses_nothing(tmp_path: Path, settings_: Settings) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    agent = make_agent(tmp_path, url)
    agent.start()
    rec = Recorder(JOB, socket_path=str(tmp_path / "a.sock"), flush_interval_s=0.01)
    feed(rec, 1500)
    assert rec.flush()
    assert wait_for(lambda: agent.stats.records_sealed == 3000)
    assert len(agent.outbox) >= 1  # spooled while nobody listens
    assert wait_for(lambda: agent.stats.retries >= 1)  # and retried
    with live_service(settings_, port=port):
        assert wait_for(lambda: len(agent.outbox) == 0)
        assert accepted_on_service(url) == 3000
    agent.stop(drain_timeout_s=0)
    rec.close()


def test_agent_restart_resumes_its_outbox_and_stream(tmp_path: Path, settings_: Settings) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    first = make_agent(tmp_path, url)
    first.add_items([["r", 0, 0, 2], ["r", 1, 1, 2], ["m", "dp", "dp", [0, 1]]])
    first.add_items(
        [
            ["c", r, "dp", i, "allreduce", 4, 10**18 + i, 10**18 + i + 1, None]
            for i in range(50)
            for r in (0, 1)
        ]
    )
    first.seal()
    first.add_items(
        [
            ["c", r, "dp", i, "allreduce", 4, 10**18 + i, 10**18 + i + 1, None]
            for i in range(50, 80)
            for r in (0, 1)
        ]
    )
    first.seal()
    stream = first.agent_id
    first.stop(drain_timeout_s=0)  # the service is down: both envelopes stay in the outbox
    assert len(first.outbox) == 2
    second = make_agent(tmp_path, url)
    assert second.agent_id == stream and second.next_seq == 2 and len(second.outbox) == 2
    with live_service(settings_, port=port):
        second.start()
        assert wait_for(lambda: accepted_on_service(url) == 160)
        second.stop()


class _Scripted(http.server.BaseHTTPRequestHandler):
    """Answers envelopes (POST) from a script, then forwards to the real service (``upstream``);
    topology registrations (PUT) always go through."""

    script: list[tuple[int, dict[str, str]]] = []
    upstream = ""
    seen: list[int] = []
    forward_then_fail = 0

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.seen.append(len(body))
        if _Scripted.forward_then_fail > 0:
            _Scripted.forward_then_fail -= 1
            httpx.post(self.upstream + self.path, content=body, headers=self._forwarded())
            self.send_response(502)  # stored upstream, but the answer is "lost"
            self.end_headers()
            return
        if self.script:
            status, headers = self.script.pop(0)
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Type", "application/problem+json")
            self.end_headers()
            self.wfile.write(b'{"detail": "scripted"}')
            return
        self._relay(httpx.post(self.upstream + self.path, content=body, headers=self._forwarded()))

    def do_PUT(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self._relay(httpx.put(self.upstream + self.path, content=body, headers=self._forwarded()))

    def _forwarded(self) -> dict[str, str]:
        return {
            "Content-Type": self.headers.get("Content-Type", "application/json"),
            "Content-Encoding": self.headers.get("Content-Encoding", ""),
        }

    def _relay(self, r: httpx.Response) -> None:
        self.send_response(r.status_code)
        self.send_header("Content-Type", r.headers.get("content-type", "application/json"))
        self.end_headers()
        self.wfile.write(r.content)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def scripted(settings_: Settings) -> Iterator[tuple[str, str]]:
    with live_service(settings_) as upstream:
        _Scripted.upstream, _Scripted.script, _Scripted.seen, _Scripted.forward_then_fail = (
            upstream,
            [],
            [],
            0,
        )
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
        t = threading.Thread(target=server.serve_forever, daemon=True)
        t.start()
        yield f"http://127.0.0.1:{server.server_address[1]}", upstream
        server.shutdown()
        server.server_close()


def test_429_is_honoured_then_delivered(tmp_path: Path, scripted: tuple[str, str]) -> None:
    proxy, upstream = scripted
    _Scripted.script = [(429, {"Retry-After": "1"})]
    agent = make_agent(tmp_path, proxy)
    agent.add_items([["r", 0, 0, 1], ["m", "w", "world", [0]], ["s", 0, 1, 10, 20]])
    agent.seal()
    assert agent.deliver_once() == "retry"
    assert agent.deliver_once() == "ok"
    assert accepted_on_service(upstream) == 1 and agent.stats.retries == 1
    agent.sender.close()


def test_lost_answer_is_resent_and_counted_once(tmp_path: Path, scripted: tuple[str, str]) -> None:
    proxy, upstream = scripted
    _Scripted.forward_then_fail = 1
    agent = make_agent(tmp_path, proxy)
    agent.add_items(
        [["r", 0, 0, 1], ["m", "w", "world", [0]]]
        + [["s", 0, i, 10 * i, 10 * i + 5] for i in range(20)]
    )
    agent.seal()
    assert agent.deliver_once() == "retry"  # stored upstream, answer lost
    assert agent.deliver_once() == "ok"
    assert agent.stats.records_duplicate == 20 and agent.stats.records_accepted == 0
    detail = httpx.get(f"{upstream}/v1/jobs/{JOB}").json()["ingest"]["h0"]
    assert (detail["accepted"], detail["duplicates"]) == (20, 20)
    agent.sender.close()


def test_refused_envelope_is_buried_not_retried(tmp_path: Path, scripted: tuple[str, str]) -> None:
    proxy, _ = scripted
    _Scripted.script = [(400, {})]
    agent = make_agent(tmp_path, proxy)
    agent.add_items([["s", 0, 1, 10, 20]])
    agent.seal()
    assert agent.deliver_once() == "refused"
    assert agent.deliver_once() == "empty"
    assert agent.stats.refused_envelopes == 1 and agent.stats.dropped_records == 1
    assert any(p.suffix == ".why" for p in (tmp_path / "state" / "outbox" / "dead").iterdir())
    agent.sender.close()


def test_a_refused_token_keeps_the_data_and_raises_the_alarm(
    tmp_path: Path, scripted: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """401/403 (a rotated or mistyped token) used to bury envelopes in outbox/dead for good."""
    proxy, upstream = scripted
    _Scripted.script = [(401, {}), (403, {}), (404, {})]
    agent = make_agent(tmp_path, proxy)
    agent.add_items([["r", 0, 0, 1], ["m", "w", "world", [0]], ["s", 0, 1, 10, 20]])
    agent.seal()
    with caplog.at_level("ERROR"):
        assert [agent.deliver_once() for _ in range(3)] == ["retry"] * 3
    assert agent.stats.auth_failures == 2 and agent.stats.refused_envelopes == 0
    assert len(agent.outbox) == 1 and agent.stats.dropped_records == 0
    assert sum("refuses this agent's token" in r.getMessage() for r in caplog.records) == 1
    assert agent.deliver_once() == "ok"  # the token works again: delivered, nothing lost
    assert accepted_on_service(upstream) == 1
    dead = tmp_path / "state" / "outbox" / "dead"
    assert not dead.exists() or not any(dead.iterdir())
    agent.sender.close()


def test_foreign_job_and_garbage_are_counted(tmp_path: Path) -> None:
    agent = make_agent(tmp_path, "http://127.0.0.1:9")
    agent.add_payload(b'{"v": 1, "job": "other"}\n["s", 0, 1, 2, 3]')
    agent.add_payload(b"garbage")
    agent.add_items([["zz"], ["c", 1]])
    assert agent.stats.foreign_job_messages == 1
    assert agent.stats.bad_messages == 3
    assert agent.seal() is None
    agent.sender.close()


def test_spool_input_files_are_deleted_only_once_sealed(
    tmp_path: Path, settings_: Settings
) -> None:
    spool = tmp_path / "sdk"
    rec = Recorder(JOB, spool_dir=str(spool), flush_interval_s=0.01)
    feed(rec, 100)
    assert rec.flush()
    rec.close()
    files = list(spool.glob("*.jsonl"))
    assert files
    with live_service(settings_) as url:
        agent = make_agent(
            tmp_path, url, socket_path=None, input_dir=str(spool), flush_interval_s=0.2
        )
        agent.start()
        assert wait_for(lambda: accepted_on_service(url) == 200)
        agent.stop()
    assert not list(spool.glob("*.jsonl"))


def test_v2_registers_again_after_a_service_restart(tmp_path: Path, settings_: Settings) -> None:
    """Across a service restart, with a topology the service never saw (a new comm): the agent
    registers it (on a 409 unknown-topology, or before sending) and re-sends: nothing lost,
    nothing twice. (Registrations the service stored survive the restart:
    tests/service/ingest/test_ingest_v2.py.)"""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    agent = make_agent(tmp_path, url)
    items = [["r", 0, 0, 2], ["r", 1, 1, 2], ["m", "dp", "dp", [0, 1]]]
    coll = [["c", r, "dp", i, "allreduce", 4, 10**18 + i, 10**18 + i + 1, None]
            for i in range(40) for r in (0, 1)]  # fmt: skip
    with live_service(settings_, port=port):
        agent.add_items(items + coll[:40])
        agent.seal()
        assert agent.deliver_once() == "ok" and agent.stats.registrations == 1
    with live_service(settings_, port=port):
        agent.add_items(coll[40:] + [["m", "tp", "tp", [0, 1]]])  # a new comm: a new digest
        agent.seal()
        outcomes = [agent.deliver_once() for _ in range(3)]
        assert outcomes[-1] == "empty" and "ok" in outcomes
        assert accepted_on_service(url) == 80 and agent.stats.registrations == 2
        detail = httpx.get(f"{url}/v1/jobs/{JOB}").json()
        assert detail["comms"] == 2 and detail["ingest"]["h0"]["duplicates"] == 0
    agent.sender.close()


def test_v1_protocol_still_sends_json(tmp_path: Path, settings_: Settings) -> None:
    with live_service(settings_) as url:
        agent = make_agent(tmp_path, url, protocol="v1")
        agent.add_items([["r", 0, 0, 1], ["m", "w", "world", [0]], ["s", 0, 1, 10, 20]])
        agent.seal()
        _, payload, _ = agent.outbox.oldest()  # type: ignore[misc]
        assert payload[:2] == b"\x1f\x8b" and gzip.decompress(payload).startswith(b"{")
        assert agent.deliver_once() == "ok" and accepted_on_service(url) == 1
        agent.sender.close()
