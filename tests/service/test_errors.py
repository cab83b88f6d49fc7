"""Every error is problem+json, a bug's 500 included, with a correlation id the log carries."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from failslow.service.app import create_app
from failslow.service.errors import PROBLEM
from failslow.service.jobs import views
from failslow.service.settings import Settings


def test_an_unexpected_error_is_a_problem_with_a_correlation_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*_a: object, **_k: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(views, "open_counts", broken)
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path}/f.db"))
    with TestClient(app, raise_server_exceptions=False) as client, caplog.at_level(logging.ERROR):
        r = client.get("/v1/jobs")
    assert r.status_code == 500 and r.headers["content-type"] == PROBLEM
    body = r.json()
    assert body["type"].endswith("/internal") and body["status"] == 500
    cid = body["correlation_id"]
    assert len(cid) == 16 and r.headers["x-correlation-id"] == cid and cid in body["detail"]
    assert "a bug" not in r.text  # no internals to the client ...
    logged = [rec for rec in caplog.records if cid in rec.getMessage()]
    assert logged and logged[0].exc_info is not None  # ... the log has the traceback
