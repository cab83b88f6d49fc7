"""Settings validation and bearer-token authentication."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from failslow.service.app import create_app
from failslow.service.settings import AuthSettings, Settings, hash_token
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
