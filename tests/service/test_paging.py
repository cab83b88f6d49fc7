"""Lists page with a cursor and filter by an RFC 3339 time range, and still answer JSON arrays."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from failslow.service.actions.models import Action
from failslow.service.app import create_app
from failslow.service.incidents.models import Incident
from failslow.service.jobs.models import Job
from failslow.service.settings import Settings

S = 1_000_000_000
T0 = 1_800_000_000 * S  # 2027-01-15T08:00:00Z


def _fill(session: Session) -> None:
    session.add(Job(id="j", world_size=8, first_seen_ns=T0, last_seen_ns=T0, watermark_ns=T0))
    session.flush()
    for i in range(25):
        session.add(
            Incident(
                id=f"inc_{i:04d}",
                job_id="j",
                kind="slow_gpu",
                subject=f"slot:{i}",
                state="resolved" if i < 20 else "open",
                ranks=[i],
                hosts=["h"],
                slowdown=1.2,
                subject_slowdown=1.5,
                confidence=0.9,
                severity="major",
                onset_ns=T0 + i * 60 * S,
                detected_ns=T0 + i * 60 * S + S,
                resolved_ns=T0 + i * 60 * S + 30 * S if i < 20 else None,
                onset_step=i,
                detected_step=i,
                resolved_step=None,
                summary="s",
                evidence={},
                updated_ns=T0,
            )
        )
        session.flush()
        session.add(
            Action(
                id=f"act_{i:04d}",
                incident_id=f"inc_{i:04d}",
                job_id="j",
                kind="notify",
                target="incident:x",
                state="succeeded",
                reason="r",
                created_ns=T0 + (i // 2) * S,
                updated_ns=T0,
                actuator="log",
                mode="auto",
                dry_run=False,
                params={},
                idempotency_key=f"k{i}",
                decided_event_ns=T0,
            )
        )


def _all(c: TestClient, url: str) -> tuple[list[str], int]:
    ids, pages = [], 0
    while url:
        r = c.get(url)
        assert r.status_code == 200 and isinstance(r.json(), list)
        ids += [x["id"] for x in r.json()]
        pages += 1
        link = r.headers.get("link")
        url = link.split(">")[0].lstrip("<").replace("http://testserver", "") if link else ""
        assert (r.headers.get("x-next-cursor") is None) == (not link)
    return ids, pages


def test_cursor_pages_and_time_ranges(tmp_path: Path) -> None:
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path}/p.db"))
    with TestClient(app) as c:
        with app.state.ctx.sessions() as s:
            _fill(s)
            s.commit()
        ids, pages = _all(c, "/v1/incidents?limit=10")
        assert ids == [f"inc_{i:04d}" for i in range(25)] and pages == 3
        ids, pages = _all(c, "/v1/jobs/j/actions?limit=4")
        assert ids == [f"act_{i:04d}" for i in range(25)] and pages == 7  # ties on created_ns
        ids, _ = _all(c, "/v1/actions?limit=3&state=succeeded")
        assert len(ids) == 25
        # active in [T0+5 min, T0+10 min]: onset before its end, not resolved before its start
        r = c.get(
            "/v1/jobs/j/incidents",
            params={"since": "2027-01-15T08:05:00Z", "until": "2027-01-15T08:10:00+00:00"},
        )
        assert [x["id"] for x in r.json()] == [f"inc_{i:04d}" for i in range(5, 11)]
        assert r.json()[0]["onset"] == "2027-01-15T08:05:00.000Z"
        r = c.get("/v1/actions", params={"since": "2027-01-15T08:00:10Z"})
        assert [x["id"] for x in r.json()] == [f"act_{i:04d}" for i in range(20, 25)]
        assert c.get("/v1/actions?after=bogus").status_code == 422
        assert c.get("/v1/incidents?limit=0").status_code == 422
        assert c.get("/v1/incidents?since=yesterday").status_code == 422


def test_jobs_and_ranks_page_too(tmp_path: Path) -> None:
    from failslow.harness.simulator import Layout, Scenario

    app = create_app(Settings(database_url=f"sqlite:///{tmp_path}/r.db"))
    with TestClient(app) as c:
        for job in ("a", "b", "c"):
            sc = Scenario(job=job, layout=Layout(tp=2, pp=1, dp=4, gpus_per_host=4), steps=20)
            for env in sc.envelopes():
                c.post("/v1/ingest", json=env)
        ids, pages = _all_by(c, "/v1/jobs?limit=2", "job")
        assert ids == ["a", "b", "c"] and pages == 2
        ranks, pages = _all_by(c, "/v1/jobs/b/ranks?limit=3", "rank")
        assert ranks == list(range(8)) and pages == 3
        assert len(c.get("/v1/jobs/b/ranks").json()) == 8  # without a limit: all, as before


def _all_by(c: TestClient, url: str, key: str) -> tuple[list[object], int]:
    got, pages = [], 0
    while url:
        r = c.get(url)
        assert r.status_code == 200
        got += [x[key] for x in r.json()]
        pages += 1
        link = r.headers.get("link")
        url = link.split(">")[0].lstrip("<").replace("http://testserver", "") if link else ""
    return got, pages
