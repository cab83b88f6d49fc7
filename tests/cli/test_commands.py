"""The command line as a newcomer meets it: --version, every --help, bad arguments and bad
settings end in one line that says what to do (never a traceback); client contexts."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from failslow.cli import build_parser, cmd_eval, main
from failslow.cli.client import parse_duration, resolve_target
from tests.ports import free_port


def _commands() -> list[str]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return [name for name in sub.choices if name != "eval"]


def test_version_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.startswith("failslow ")


@pytest.mark.parametrize("command", _commands())
def test_every_help_exits_0(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_eval_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    if not (Path(__file__).resolve().parents[2] / "bench" / "eval" / "runner.py").exists():
        pytest.skip("no source checkout")
    with pytest.raises(SystemExit) as exc:
        cmd_eval(["--help"])
    assert exc.value.code == 0


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["simulate", "--fault", "bogus", "--out", "{tmp}/x.jsonl"], "unknown fault kind 'bogus'"),
        (["simulate", "--fault", "slow_gpu:gpu=1", "--out", "{tmp}/x.jsonl"], "unknown fault key"),
        (["bench", "e2e", "--ranks", "10000"], "a multiple of 32"),
        (["get", "bogus"], "invalid choice"),
        (["nosuch"], "invalid choice"),
        (["mute", "job-a"], "--reason"),
        (["config", "set", "detection.window"], "needs KEY VALUE and --reason"),
        (["get", "ranks"], "needs --job"),
        (["mute", "j", "--for", "soon", "--reason", "x"], "not a duration"),
    ],
)
def test_bad_arguments_end_in_one_line(argv: list[str], says: str, tmp_path: Path) -> None:
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    env = {
        **os.environ,
        "FAILSLOW_URL": f"http://127.0.0.1:{free_port()}",
        "FAILSLOW_CLIENT_CONFIG": str(tmp_path / "client.json"),
    }
    r = subprocess.run(
        [sys.executable, "-m", "failslow.cli", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode in (1, 2), r
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert says in lines[0]


def test_a_service_nobody_runs_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAILSLOW_CLIENT_CONFIG", str(tmp_path / "c.json"))
    with pytest.raises(SystemExit) as exc:
        main(["get", "jobs", "--url", f"http://127.0.0.1:{free_port()}"])
    assert str(exc.value).startswith("failslow: cannot reach the service at")


@pytest.mark.parametrize(
    ("env", "says"),
    [
        (
            {"FAILSLOW_DETECTON__WINDOW": "7"},
            "FAILSLOW_DETECTON__WINDOW: not a failslow setting "
            "(did you mean FAILSLOW_DETECTION__WINDOW?)",
        ),
        ({"FAILSLOW_DETECTION__WINDOW": "abc"}, "FAILSLOW_DETECTION__WINDOW=abc: Input should be"),
        (
            {"FAILSLOW_AUTH__INGEST_SCOPES": "{bad"},
            "FAILSLOW_AUTH__INGEST_SCOPES={bad: not valid JSON",
        ),
        ({"FAILSLOW_DETECTION__OPEN_AFTER": "99"}, "open_after must be <= detection.window"),
    ],
)
def test_bad_settings_stop_serve_naming_the_variable(
    env: dict[str, str], says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--database-url", "sqlite:///:memory:"])
    assert says in str(exc.value)


def test_other_failslow_variables_are_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    from failslow.service.settings import from_environment

    monkeypatch.setenv("FAILSLOW_JOB", "train")  # the agent's, set on the same node
    monkeypatch.setenv("FAILSLOW_DETECTION__WINDOW", "9")
    assert from_environment().detection.window == 9


def test_contexts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "client.json"
    monkeypatch.setenv("FAILSLOW_CLIENT_CONFIG", str(cfg))
    for var in ("FAILSLOW_URL", "FAILSLOW_TOKEN", "FAILSLOW_CONTEXT"):
        monkeypatch.delenv(var, raising=False)
    assert resolve_target(None, None, None).url == "http://127.0.0.1:8000"
    assert main(["context", "set", "prod", "--url", "https://prod:8000/", "--token", "t1"]) == 0
    assert main(["context", "set", "lab", "--url", "http://lab:8000"]) == 0
    assert oct(cfg.stat().st_mode & 0o777) == "0o600"  # it holds tokens
    t = resolve_target(None, None, None)  # the first one set is current
    assert (t.url, t.token, t.context) == ("https://prod:8000", "t1", "prod")
    assert main(["context", "use", "lab"]) == 0
    assert resolve_target(None, None, None).url == "http://lab:8000"
    assert resolve_target(None, None, "prod").token == "t1"
    monkeypatch.setenv("FAILSLOW_URL", "http://env:1")
    monkeypatch.setenv("FAILSLOW_TOKEN", "t-env")
    t = resolve_target(None, None, "prod")
    assert (t.url, t.token) == ("http://env:1", "t-env")
    assert resolve_target("http://flag:2", "t-flag", "prod").token == "t-flag"
    with pytest.raises(SystemExit, match="no context 'nope'"):
        resolve_target(None, None, "nope")
    assert json.loads(cfg.read_text())["current"] == "lab"


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90), ("90s", 90), ("15m", 900), ("2h", 7200), ("1.5d", 129600)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds
