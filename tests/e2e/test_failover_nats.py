"""Two replicas on a 3-node NATS JetStream cluster and PostgreSQL: kill -9 the owner of a job in
the middle of a slowdown (issue 15, docs/replicas.md).

Every envelope goes to the replicas in turn, as a load balancer would send it, and to the other
one when a replica does not answer. After the kill the surviving replica must own the job within
10 s, the open incident must stay open with its onset, the job's baseline must stay the healthy
one (the new owner resumed the detectors from a snapshot; without it the slowdown would become
the baseline, which this test catches: slowdown ~1.0), and every record must be counted exactly
once: per host, the stored counts equal what was sent."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from failslow.service.bus.client import partition_of
from tests.e2e.procs import CLI, env_for, start_service, stop
from tests.infra import nats as natsinfra
from tests.live import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
JOB = "failover"
PARTITIONS = 4


@pytest.fixture(scope="module")
def nats_cluster():  # type: ignore[no-untyped-def]
    why = natsinfra.unavailable()
    if why:
        pytest.skip(why)
    with natsinfra.cluster(3) as c:
        yield c


def _envelopes(tmp: Path) -> list[dict]:  # type: ignore[type-arg]
    out = tmp / "job.jsonl"
    subprocess.run(
        [*CLI, "simulate", "--job", JOB, "--tp", "2", "--pp", "1", "--dp", "8",
         "--gpus-per-host", "2", "--steps", "120", "--seed", "5", "--quiet",
         "--fault", "slow_gpu:rank=5,start=30,factor=2.0", "--out", str(out)],
        check=True, timeout=300,
    )  # fmt: skip
    envs, seq = [], Counter()
    for line in out.read_text().splitlines():
        e = json.loads(line)
        seq[e["host"]] += 1
        e["agent"], e["batch_seq"] = f"agent-{e['host']}", seq[e["host"]]  # re-sends dedupe
        envs.append(e)
    return envs


def _owner(urls: list[str], alive: list[bool]) -> int | None:
    p = str(partition_of(JOB, PARTITIONS))
    for i, url in enumerate(urls):
        if not alive[i]:
            continue
        try:
            owned = httpx.get(f"{url}/v1/replica", timeout=2).json()["owned"]
        except httpx.HTTPError:
            continue
        if p in owned and owned[p]["ready"]:
            return i
    return None


def _stream_last_seq(url: str) -> int:
    import nats

    async def last() -> int:
        nc = await nats.connect(servers=url.split(","))
        try:
            return int((await nc.jetstream().stream_info("FAILSLOW")).state.last_seq)
        finally:
            await nc.close()

    return asyncio.run(last())


def test_kill_the_owner_mid_slowdown(postgres: object, nats_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    db = postgres.create_database()  # type: ignore[attr-defined]
    envs = _envelopes(tmp_path)
    env = env_for(tmp_path / "unused.db")
    env.update({
        "FAILSLOW_DATABASE_URL": db, "FAILSLOW_BUS__URL": nats_cluster.url,
        "FAILSLOW_BUS__STREAM_REPLICAS": "3", "FAILSLOW_BUS__PARTITIONS": str(PARTITIONS),
        "FAILSLOW_BUS__OWNER_TTL_S": "3", "FAILSLOW_BUS__SNAPSHOT_EVERY_S": "1",
    })  # fmt: skip
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    procs = [start_service(p, tmp_path / "unused.db", tmp_path / f"r{i}.log", env)
             for i, p in enumerate(ports)]  # fmt: skip
    alive = [True, True]
    sent: Counter[str] = Counter()
    stop_feed = threading.Event()

    def feed() -> None:  # ~20 s of event time at its own pace, round robin with fail-over
        with httpx.Client(timeout=5) as client:
            for n, e in enumerate(envs):
                if stop_feed.is_set():
                    return
                for attempt in range(200):
                    url = urls[(n + attempt) % 2]
                    try:
                        r = client.post(f"{url}/v1/ingest", json=e)
                    except httpx.HTTPError:
                        time.sleep(0.05)
                        continue
                    if r.status_code == 200:
                        break
                    time.sleep(0.05)
                else:
                    raise AssertionError(f"envelope {n} never accepted")
                sent[e["host"]] += len(e.get("collectives", [])) + len(e.get("steps", []))
                time.sleep(0.03)

    feeder = threading.Thread(target=feed, daemon=True)
    try:
        # both replicas own a share of the partitions
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            shares = [len(httpx.get(f"{u}/v1/replica").json()["owned"]) for u in urls]
            if sorted(shares) == [PARTITIONS // 2, PARTITIONS // 2]:
                break
            time.sleep(0.3)
        assert sorted(shares) == [PARTITIONS // 2] * 2, shares
        feeder.start()
        incident = None
        deadline = time.monotonic() + 90
        while incident is None and time.monotonic() < deadline:
            time.sleep(0.3)
            found = httpx.get(f"{urls[0]}/v1/jobs/{JOB}/incidents?state=open")
            if found.status_code == 200:
                incident = next((i for i in found.json() if i["kind"] == "slow_gpu"), None)
        assert incident is not None, "the slowdown was never detected"
        assert incident["ranks"] == [5]
        victim = _owner(urls, alive)
        assert victim is not None
        while time.monotonic() < deadline:  # the job's step time shows the slowdown
            before = httpx.get(f"{urls[victim]}/v1/jobs/{JOB}").json()
            if before["slowdown"] and before["slowdown"] > 1.5:
                break
            time.sleep(0.2)
        assert before["slowdown"] > 1.5, before
        procs[victim].send_signal(signal.SIGKILL)
        procs[victim].wait()
        alive[victim] = False
        killed = time.monotonic()
        while _owner(urls, alive) is None and time.monotonic() - killed < 30:
            time.sleep(0.2)
        took = time.monotonic() - killed
        assert _owner(urls, alive) == 1 - victim and took <= 10, took
        feeder.join(timeout=120)
        assert not feeder.is_alive()
        survivor = urls[1 - victim]
        # everything in the stream applied and committed, nothing pending
        last = _stream_last_seq(nats_cluster.url)
        p = str(partition_of(JOB, PARTITIONS))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            part = httpx.get(f"{survivor}/v1/replica").json()["owned"][p]
            if part["position"] == part["applied_through"] == last:
                break
            time.sleep(0.2)
        assert part["position"] == part["applied_through"] == last, (part, last)
        after = httpx.post(f"{survivor}/v1/jobs/{JOB}/flush")
        assert after.status_code == 200
        # the detectors resumed: the healthy baseline is kept, the slowdown not learned as normal
        base = before["baseline_step_time_s"]
        assert abs(after.json()["baseline_step_time_s"] - base) < 0.1 * base, (before, after.json())
        assert after.json()["slowdown"] > 1.5, after.json()
        ingest = httpx.get(f"{survivor}/v1/jobs/{JOB}").json()["ingest"]
        assert {h: c["accepted"] for h, c in ingest.items()} == dict(sent)
        assert sum(c["rejected"] for c in ingest.values()) == 0
        slow = [i for i in httpx.get(f"{survivor}/v1/jobs/{JOB}/incidents").json()
                if i["kind"] == "slow_gpu"]  # fmt: skip
        assert [(i["id"], i["state"], i["onset_step"]) for i in slow] == [
            (incident["id"], "open", incident["onset_step"])
        ], slow
        print(f"failover: owner gone -> survivor owns the job in {took:.1f} s; "
              f"{sum(sent.values())} records, counted once")  # fmt: skip
    finally:
        stop_feed.set()
        for proc in procs:
            stop(proc, signal.SIGTERM)
