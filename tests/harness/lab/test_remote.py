"""``failslow lab --service URL`` (issue 16): a loopback URL works (the agents run outside the
namespaces), and the lab stops at once with the reason when the service does not answer or
refuses the token, instead of reporting every fault NOT found."""

from __future__ import annotations

from pathlib import Path

import pytest

from failslow.cli import main as cli_main
from failslow.harness.lab import cli as lab_cli
from failslow.harness.lab import remote
from failslow.harness.lab.system import LabError
from failslow.service.auth import AuthSettings
from failslow.service.settings import Settings
from tests.live import free_port, live_service


def test_loopback_urls() -> None:
    assert remote.is_loopback("http://127.0.0.1:8077") and remote.is_loopback("http://[::1]:80")
    assert remote.is_loopback("http://localhost:1")
    assert not remote.is_loopback("http://10.77.0.254:8077")
    assert not remote.is_loopback("http://failslow.example:80")


def test_an_unreachable_service_stops_the_lab_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(lab_cli, "preflight", lambda: [])
    url = f"http://127.0.0.1:{free_port()}"  # nobody listens
    argv = ["lab", "--service", url, "--workdir", str(tmp_path / "w"), "--prefix", "fsz"]
    assert cli_main(argv) == 1
    err = capsys.readouterr().err
    assert f"the service at {url} does not answer" in err


def test_a_refused_token_stops_the_lab_with_the_reason(tmp_path: Path) -> None:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path}/f.db",
        auth=AuthSettings(ingest_tokens=["right"], read_tokens=["right"]),
    )
    with live_service(settings) as url:
        remote.check_service(url, "right")
        with pytest.raises(LabError, match="refuses the --token given.*HTTP 401 for read"):
            remote.check_service(url, "wrong")
        with pytest.raises(LabError, match="needs a token"):
            remote.check_service(url, None)


def test_agents_that_delivered_nothing_stop_the_lab() -> None:
    ok = {"records_accepted": 10}
    remote.check_delivery("u", [ok, {}])
    with pytest.raises(LabError, match="refuses the agents' token"):
        remote.check_delivery("u", [{"auth_failures": 3}, {"auth_failures": 2}])
    with pytest.raises(LabError, match="last errors: ConnectError"):
        remote.check_delivery("u", [{"last_error": "ConnectError"}, {}])
