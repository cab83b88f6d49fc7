"""The probe manager reads the open hang and slow-link incidents from the database at most every
``incident_poll_s`` (not at every detection pass), and sees new ones at the next read."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from failslow.detectors.vocab import IncidentKind
from failslow.service.db import make_engine, make_sessionmaker, session_scope
from failslow.service.incidents.service import IncidentDraft, open_incident
from failslow.service.metrics import Metrics
from failslow.service.probes import manager as probes_manager
from failslow.service.probes.manager import ProbeManager
from failslow.service.settings import ProbeSettings
from tests.helpers import T0, envelope


def _hang(client: TestClient, sessions: object, job: str) -> str:
    env = envelope(job=job, host="h0", ranks=[{"rank": 3, "world_size": 4}])
    assert client.post("/v1/ingest", json=env).status_code == 200  # the job exists
    with session_scope(sessions) as s:  # type: ignore[arg-type]
        inc, _ = open_incident(
            s,
            draft=IncidentDraft(
                job=job, kind=IncidentKind.HANG, subject="job", ranks=[3], hosts=["h0"],
                slowdown=None, subject_slowdown=None, confidence=0.9, onset_ns=T0,
                detected_ns=T0, onset_step=None, detected_step=None, summary="hung",
                evidence={},
            ),
            now_ns=T0,
        )  # fmt: skip
        return str(inc.id)


def test_open_incidents_are_read_at_most_every_incident_poll_s(
    client: TestClient, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions = make_sessionmaker(make_engine(db_url))  # the app (client) migrated the database
    now = [10**18]
    monkeypatch.setattr(probes_manager.time, "time_ns", lambda: now[0])
    pm = ProbeManager(
        settings=ProbeSettings(incident_poll_s=2.0), sessions=sessions, metrics=Metrics()
    )
    first = _hang(client, sessions, "job-a")
    pm.run_due()
    assert pm.hangs == {"job-a": [first]}
    second = _hang(client, sessions, "job-b")
    now[0] += int(1.9e9)
    pm.run_due()
    assert pm.hangs == {"job-a": [first]}  # not read again yet
    now[0] += int(0.2e9)
    pm.run_due()
    assert pm.hangs == {"job-a": [first], "job-b": [second]}
