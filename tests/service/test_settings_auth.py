"""Settings validation and bearer-token authentication."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from failslow.service.app import create_app
from failslow.service.settings import AuthSettings, Settings, hash_token
from failslow.wire import v2
from tests.helpers import envelope


def test_public_bind_without_tokens_is_refused() -> None:
    with pytest.raises(ValidationError, match="refusing to bind"):
        Settings(host="0.0.0.0")
    assert Settings(host="0.0.0.0", insecure=True).insecure
    assert Settings(host="0.0.0.0", auth=AuthSettings(ingest_tokens=["t"])).auth.enabled
    assert Settings(host="::1").host == "::1"


def test_environment_is_read_with_prefix_and_nesting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAILSLOW_DATABASE_URL", "sqlite:///x.db")
    monkeypatch.setenv("FAILSLOW_DETECTION__WINDOW", "7")
    monkeypatch.setenv("FAILSLOW_AUTH__READ_TOKENS", "abc,sha256:" + "0" * 64)
    s = Settings()
    assert s.database_url == "sqlite:///x.db" and s.detection.window == 7
    assert s.auth.read_tokens == [hash_token("abc"), "sha256:" + "0" * 64]  # plaintext never kept
    monkeypatch.setenv("FAILSLOW_AUTH__READ_TOKENS", '["abc", "def"]')  # JSON, as other lists
    assert Settings().auth.read_tokens == [hash_token("abc"), hash_token("def")]  # not one token
    monkeypatch.setenv("FAILSLOW_AUTH__READ_TOKENS", '["abc"')
    with pytest.raises(ValidationError, match="comma-separated or a JSON list"):
        Settings()


def test_invalid_detection_settings_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAILSLOW_DETECTION__OPEN_AFTER", "9")
    with pytest.raises(ValidationError, match="open_after"):
        Settings()


def test_cli_refuses_public_bind_without_tokens() -> None:
    from failslow.cli import main

    with pytest.raises(SystemExit, match="refusing to bind"):
        main(["serve", "--host", "0.0.0.0", "--port", "0"])


@pytest.fixture
def secured(db_url: str):  # type: ignore[no-untyped-def]
    auth = AuthSettings(
        ingest_tokens=["agent-secret"],
        read_tokens=["reader-secret"],
        operator_tokens=["op-secret"],
        metrics_public=False,
    )
    with TestClient(create_app(Settings(database_url=db_url, auth=auth))) as c:
        yield c


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_roles(secured: TestClient) -> None:
    env = envelope()
    r = secured.post("/v1/ingest", json=env)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.headers["content-type"] == "application/problem+json"
    assert secured.post("/v1/ingest", json=env, headers=bearer("wrong")).status_code == 401
    assert secured.post("/v1/ingest", json=env, headers=bearer("reader-secret")).status_code == 403
    assert secured.post("/v1/ingest", json=env, headers=bearer("agent-secret")).status_code == 200
    assert secured.get("/v1/jobs").status_code == 401
    assert secured.get("/v1/jobs", headers=bearer("agent-secret")).status_code == 403
    assert secured.get("/v1/jobs", headers=bearer("reader-secret")).status_code == 200
    assert secured.get("/v1/jobs", headers=bearer("op-secret")).status_code == 200
    assert secured.get("/metrics").status_code == 401
    assert secured.get("/metrics", headers=bearer("reader-secret")).status_code == 200
    assert secured.post("/v1/jobs/job-a/flush", headers=bearer("reader-secret")).status_code == 403
    assert secured.post("/v1/jobs/job-a/flush", headers=bearer("agent-secret")).status_code == 200
    assert secured.post("/v1/jobs/job-a/flush", headers=bearer("op-secret")).status_code == 200
    assert secured.get("/healthz").status_code == 200  # probes stay open


def test_token_command_prints_a_usable_hash(capsys) -> None:  # type: ignore[no-untyped-def]
    from failslow.cli import main

    main(["token", "--token", "s3cret"])
    assert hash_token("s3cret") in capsys.readouterr().out


def test_an_ingest_token_scoped_to_job_patterns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ingest token may act only for the jobs its patterns match (issue 17): send v1 and v2,
    register, flush, read a plan, declare a phase."""
    monkeypatch.setenv("FAILSLOW_AUTH__INGEST_SCOPES", '{"team-a-secret": ["team-a-*"]}')
    monkeypatch.setenv("FAILSLOW_AUTH__OPERATOR_TOKENS", "op-secret")
    settings = Settings(database_url=f"sqlite:///{tmp_path}/f.db")
    a = bearer("team-a-secret")
    with TestClient(create_app(settings)) as c:
        ok = c.post("/v1/ingest", json=envelope(job="team-a-1"), headers=a)
        assert ok.status_code == 200
        for job in ("team-b-1", "x-team-a-1"):
            r = c.post("/v1/ingest", json=envelope(job=job), headers=a)
            assert r.status_code == 403 and "may not act for job" in r.json()["detail"]
        reg = {"sent_ns": 1, "ranks": [{"rank": 0, "world_size": 1}], "comms": []}
        assert c.put("/v2/jobs/team-b-1/topology/h0", json=reg, headers=a).status_code == 403
        assert c.put("/v2/jobs/team-a-1/topology/h0", json=reg, headers=a).status_code == 200
        body = v2.encode({"job": "team-b-1", "host": "h0", "sent_ns": 1, "topology": "00"}, {}, {})
        r = c.post("/v2/ingest", content=body, headers={**a, "Content-Type": v2.MEDIA_TYPE})
        assert r.status_code == 403  # the fast path too
        assert c.post("/v1/jobs/team-b-1/flush", headers=a).status_code == 403
        assert c.post("/v1/jobs/team-a-1/flush", headers=a).status_code == 200
        assert c.get("/v1/jobs/team-b-1/plan", headers=a).status_code == 403
        phase = c.put("/v1/jobs/team-b-1/phase", json={"critical": True}, headers=a)
        assert phase.status_code == 403
        # an operator is not scoped
        assert c.post("/v1/jobs/team-a-1/flush", headers=bearer("op-secret")).status_code == 200


def test_tokens_are_read_again_when_their_file_changes(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"ingest_tokens": ["old-secret"]}))
    settings = Settings(
        database_url=f"sqlite:///{tmp_path}/f.db", auth=AuthSettings(tokens_file=str(tokens))
    )
    with TestClient(create_app(settings)) as c:
        post = lambda t: c.post("/v1/ingest", json=envelope(), headers=bearer(t)).status_code  # noqa: E731
        assert (post("old-secret"), post("new-secret")) == (200, 401)
        tokens.write_text(json.dumps({"ingest_tokens": [hash_token("new-secret")]}))
        os.utime(tokens, (time.time() + 5, time.time() + 5))  # a new mtime, whatever the clock
        time.sleep(1.1)  # read again at most once a second
        assert (post("old-secret"), post("new-secret")) == (401, 200)
        tokens.write_text("{not json")  # a broken rewrite keeps the last good tokens
        os.utime(tokens, (time.time() + 10, time.time() + 10))
        time.sleep(1.1)
        assert post("new-secret") == 200
