"""Two service processes on one PostgreSQL database.

By default the second refuses to start, naming the first (the database lease, service/lease.py).
With the lease turned off (``lease_ttl_s=0``) both run, fed the same faulty job at the same time
(as two replicas that each received every envelope), and the storage still holds one open
incident per (kind, subject), one action per idempotency key, each action carried out once, and
plan versions without gaps or duplicates: the constraints underneath the lease hold on their own."""

from __future__ import annotations

import subprocess
import threading
from collections import Counter
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from failslow.service.db import make_engine
from tests.e2e.procs import CLI, env_for, start_service, stop
from tests.live import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_a_second_service_on_one_database_refuses_naming_the_first(
    postgres: object, tmp_path: Path
) -> None:
    url = postgres.create_database()  # type: ignore[attr-defined]
    env = env_for(tmp_path / "unused.db")
    env.update({"FAILSLOW_DATABASE_URL": url, "FAILSLOW_LEASE_TTL_S": "2"})
    first = start_service(free_port(), tmp_path / "unused.db", tmp_path / "first.log", env)
    try:
        second = subprocess.run(
            [*CLI, "serve", "--port", str(free_port())],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert second.returncode != 0
        assert f":{first.pid}:" in second.stderr + second.stdout
        assert "one service per database" in (second.stderr + second.stdout).lower()
    finally:
        stop(first)
    # once the first is gone (it released the lease), a new one starts at once
    again = start_service(free_port(), tmp_path / "unused.db", tmp_path / "again.log", env)
    stop(again)


def test_two_services_on_one_database_never_duplicate(postgres: object, tmp_path: Path) -> None:
    url = postgres.create_database()  # type: ignore[attr-defined]
    data = tmp_path / "job.jsonl"
    subprocess.run(
        [*CLI, "simulate", "--job", "twins", "--tp", "2", "--pp", "1", "--dp", "8",
         "--gpus-per-host", "2", "--steps", "160", "--seed", "3", "--quiet",
         "--fault", "slow_gpu:rank=5,start=30,end=70,factor=2.0",
         "--fault", "slow_nic:host=node-006,start=100,factor=3.0", "--out", str(data)],
        check=True, timeout=300,
    )  # fmt: skip
    procs: list[subprocess.Popen[bytes]] = []
    urls: list[str] = []
    try:
        # the first applies the migrations; the second starts on the migrated database
        for i in range(2):
            env = env_for(tmp_path / "unused.db")
            env["FAILSLOW_DATABASE_URL"] = url
            env["FAILSLOW_LEASE_TTL_S"] = "0"  # both run: what the storage guarantees by itself
            port = free_port()
            log = tmp_path / f"svc{i}.log"
            procs.append(start_service(port, tmp_path / "unused.db", log, env))
            urls.append(f"http://127.0.0.1:{port}")
        results: list[int] = []

        def replay(u: str) -> None:
            p = subprocess.run(
                [*CLI, "replay", str(data), "--service", u, "--quiet"], timeout=600, check=False
            )
            results.append(p.returncode)

        threads = [threading.Thread(target=replay, args=(u,)) for u in urls]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == [0, 0]
        for u in urls:  # both evaluated everything (flush) and answer consistently
            assert httpx.post(f"{u}/v1/jobs/twins/flush", timeout=60).status_code == 200
        found = httpx.get(f"{urls[0]}/v1/jobs/twins/incidents").json()
        assert any(i["kind"] == "slow_gpu" and i["ranks"] == [5] for i in found), found
        assert any(i["kind"] == "slow_link" and "node-006" in i["hosts"] for i in found), found
    finally:
        for p in procs:
            stop(p)
    engine = make_engine(url)
    try:
        with engine.connect() as c:
            open_dupes = c.execute(
                text(
                    "SELECT kind, subject, count(*) FROM incidents WHERE state = 'open' "
                    "GROUP BY job_id, kind, subject HAVING count(*) > 1"
                )
            ).all()
            keys = c.execute(text("SELECT idempotency_key FROM actions")).scalars().all()
            executing = c.execute(
                text(
                    "SELECT action_id, count(*) FROM action_events WHERE to_state = 'executing' "
                    "GROUP BY action_id"
                )
            ).all()
            versions = (
                c.execute(text("SELECT version FROM plans WHERE job_id = 'twins' ORDER BY version"))
                .scalars()
                .all()
            )
            incidents = c.execute(text("SELECT count(*) FROM incidents")).scalar_one()
    finally:
        engine.dispose()
    assert open_dupes == []
    assert incidents >= 2
    assert keys and max(Counter(keys).values()) == 1
    assert all(n == 1 for _, n in executing)  # claimed by one process only
    assert versions == list(range(1, len(versions) + 1))
