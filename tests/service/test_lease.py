"""One service per database: the lease (service/lease.py) on SQLite and a real PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text, update

from failslow.service.app import create_app
from failslow.service.db import make_engine, make_sessionmaker, session_scope, upgrade
from failslow.service.errors import Unavailable
from failslow.service.lease import NAME, Lease, LeaseHeld, ServiceLease
from failslow.service.settings import Settings
from tests.helpers import T0

pytestmark = pytest.mark.both_databases


def sessions_for(db_url: str):  # type: ignore[no-untyped-def]
    engine = make_engine(db_url)
    upgrade(engine)
    return make_sessionmaker(engine)


def test_a_second_holder_waits_then_gives_up_naming_the_first(db_url: str) -> None:
    sessions = sessions_for(db_url)
    first = Lease(sessions, ttl_s=30)
    first.acquire()
    second = Lease(sessions, ttl_s=30)
    started = time.monotonic()
    with pytest.raises(LeaseHeld, match=first.holder):
        second.acquire(wait_s=0.5)
    assert time.monotonic() - started >= 0.5
    assert first.renew() and first.lost is None
    first.release()
    second.acquire(wait_s=0)  # free at once after a release


def test_an_expired_lease_is_taken_and_its_holder_stops(db_url: str) -> None:
    sessions = sessions_for(db_url)
    first = Lease(sessions, ttl_s=0.3)
    first.acquire()
    time.sleep(0.4)  # first stalled past its TTL
    second = Lease(sessions, ttl_s=30)
    second.acquire(wait_s=0)
    assert not first.renew()
    assert first.lost is not None and second.holder in first.lost
    first.release()  # releases nothing of the new holder
    assert second.renew()


def test_a_dead_process_of_this_host_does_not_make_a_restart_wait(db_url: str) -> None:
    sessions = sessions_for(db_url)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    crashed = Lease(sessions, ttl_s=3600)
    crashed.holder = f"{crashed.holder.split(':')[0]}:{gone}:deadbeef"
    crashed.acquire()  # as if that process had held it and been killed -9
    restart = Lease(sessions, ttl_s=30)
    restart.acquire(wait_s=0)  # no wait for the hour-long TTL
    with session_scope(sessions) as s:
        assert s.get(ServiceLease, NAME).holder == restart.holder  # type: ignore[union-attr]


def test_two_services_on_one_database(db_url: str) -> None:
    settings = Settings(database_url=db_url, lease_ttl_s=1.0)
    with TestClient(create_app(settings)) as first:
        with pytest.raises(LeaseHeld, match="another failslow service"), TestClient(
            create_app(settings)
        ):
            pass
        env = {"job": "j", "host": "h", "sent_ns": T0, "agent": "a", "batch_seq": 0}
        assert first.post("/v1/ingest", json=env).status_code == 200
        ctx = first.app.state.ctx  # type: ignore[attr-defined]
        with ctx.engine.begin() as conn:  # someone else takes over meanwhile
            conn.execute(update(ServiceLease).values(holder="other:1:x"))
        assert not ctx.lease.renew()
        r = first.post("/v1/ingest", json={**env, "batch_seq": 1})
        assert r.status_code == 503 and "lost its database lease to other:1:x" in r.text
        assert first.get("/readyz").status_code == 503
    with ctx.engine.begin() as conn:  # that other service is gone (outside our fenced sessions)
        conn.execute(update(ServiceLease).values(expires_at=0.0))
    with TestClient(create_app(settings)) as again:  # after the first is gone
        assert again.get("/readyz").status_code == 200


def test_a_service_whose_lease_was_taken_is_fenced_before_its_renewal_notices(
    db_url: str,
) -> None:
    """Issue 31, case 6: a service stopped past its TTL (SIGSTOP) wakes up, and before its
    renewal runs it committed a batch that the service now holding the lease never saw. Every
    writing transaction now checks the holder first (the fencing token): 503, nothing stored."""
    settings = Settings(database_url=db_url, lease_ttl_s=600.0)  # no renewal during the test
    with TestClient(create_app(settings)) as first:
        ctx = first.app.state.ctx  # type: ignore[attr-defined]
        step = {"rank": 0, "step": 0, "start_ns": T0 - 10, "end_ns": T0 - 5}
        env = {"job": "j", "host": "h", "sent_ns": T0, "agent": "a", "batch_seq": 0,
               "steps": [step]}  # fmt: skip
        assert first.post("/v1/ingest", json=env).status_code == 200
        with ctx.engine.begin() as conn:  # the other service takes over, outside our sessions
            conn.execute(update(ServiceLease).values(holder="other:1:x"))
        assert ctx.lease.lost is None  # nothing has noticed yet
        later = {**env, "batch_seq": 1, "steps": [{**step, "step": 1}]}
        r = first.post("/v1/ingest", json=later)
        assert r.status_code == 503 and "lost its database lease" in r.text, r.text
        assert r.headers["retry-after"] == "5"
        assert ctx.lease.lost is not None and first.get("/readyz").status_code == 503
        with pytest.raises(Unavailable), session_scope(ctx.sessions) as s:  # any write
            s.execute(update(ServiceLease).values(expires_at=1.0))
    with ctx.engine.connect() as conn:
        stored = conn.execute(text("SELECT records_accepted, envelopes, last_batch_seq FROM hosts "
                                   "JOIN agent_streams USING (job_id, host)")).all()  # fmt: skip
    assert stored == [(1, 1, 0)], stored  # batch 1 was not committed
