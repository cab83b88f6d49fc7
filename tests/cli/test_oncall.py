"""The on-call tasks with the operator CLI, `-o json`, against a real service (uvicorn, SQLite)
fed by the simulator: list, describe, mute (detected, neither acted on nor notified), unmute,
a threshold overridden for one job, resolve by hand, the audit trail with the token's actor."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest

from failslow.agents.wire import encode_envelope
from failslow.cli import main
from failslow.harness.simulator.layout import Layout
from failslow.harness.simulator.scenario import Scenario, parse_fault
from failslow.service.settings import (
    ActionsSettings,
    AuthSettings,
    DetectionSettings,
    Settings,
    StateSettings,
)
from tests.live import live_service, wait_for

OPERATOR, READER, INGEST = "op-secret", "read-secret", "ingest-secret"


def feed(url: str, job: str, fault: str | None, steps: int = 160) -> None:
    """A simulated 16-rank job (one slow GPU from step 60) sent to the service, then flushed."""
    faults = (parse_fault(fault),) if fault else ()
    scenario = Scenario(
        job=job,
        layout=Layout(tp=2, pp=2, dp=4, gpus_per_host=4),
        steps=steps,
        faults=faults,
        seed=3,
    )
    headers = {"Authorization": f"Bearer {INGEST}", "Content-Type": "application/json"}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as http:
        for env in scenario.envelopes(scenario.simulation()):
            r = http.post("/v1/ingest", content=encode_envelope(env, compress=False))
            assert r.status_code == 200, r.text
        assert http.post(f"/v1/jobs/{job}/flush").status_code == 200


def cli(capsys: pytest.CaptureFixture[str], url: str, *argv: str, token: str = OPERATOR) -> Any:
    """``failslow ARGV --url URL --token T -o json``: its JSON output."""
    rc = main([*argv, "--url", url, "--token", token, "-o", "json"])
    out = capsys.readouterr().out
    assert rc == 0, out
    return json.loads(out)


@pytest.fixture
def service(tmp_path: Path) -> Any:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path}/oncall.db",
        auth=AuthSettings(
            ingest_tokens=[INGEST],
            read_tokens=[READER],
            operator_tokens=[OPERATOR],
            token_names={OPERATOR: "alice"},
        ),
        actions=ActionsSettings(
            approval={
                "notify": "auto",
                "rebalance": "manual",
                "replan": "manual",
                "isolate": "manual",
                "restart": "manual",
            },
            costs_s={"notify": 0, "rebalance": 0.5, "replan": 30, "isolate": 0, "restart": 1},
        ),
        detection=DetectionSettings(interval_s=0.05, close_stale_after_s=0),
        # the jobs are fed first, then the CLI works on them for a minute or more on a busy
        # machine: their telemetry must not turn stale meanwhile (nothing acts on stale data)
        state=StateSettings(stale_after_s=900),
    )
    with live_service(settings) as url:
        yield url


def test_oncall_tasks_with_the_cli(
    service: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url = service
    slow = "slow_gpu:rank=5,start=60,factor=2.0"
    # mute a job before it reports: detection goes on, nothing is proposed
    control = cli(capsys, url, "mute", "muted-job", "--for", "2h", "--reason", "drill")
    assert control["muted"] and control["muted_until"] and control["mute_reason"] == "drill"
    # one threshold overridden for one job: a 2x GPU is below its compute ratio and lateness
    cli(
        capsys,
        url,
        "config",
        "set",
        "detection.compute_ratio",
        "4",
        "--job",
        "tuned-job",
        "--reason",
        "noisy node pool",
    )
    cli(
        capsys,
        url,
        "config",
        "set",
        "detection.late_fraction",
        "0.9",
        "--job",
        "tuned-job",
        "--reason",
        "noisy node pool",
    )
    cfg = cli(capsys, url, "config", "get", "detection.compute_ratio", "--job", "tuned-job")
    assert cfg == [
        {
            "key": "detection.compute_ratio",
            "value": 4.0,
            "source": "job",
            "env": "FAILSLOW_DETECTION__COMPUTE_RATIO",
            "tunable": True,
        }
    ]
    fleet = cli(capsys, url, "config", "get", "detection.compute_ratio")
    assert fleet[0]["source"] == "default"

    for job in ("muted-job", "tuned-job", "plain-job"):
        feed(url, job, slow)

    jobs = {j["job"]: j for j in cli(capsys, url, "get", "jobs", token=READER)}
    assert set(jobs) == {"muted-job", "tuned-job", "plain-job"}
    incidents = cli(capsys, url, "get", "incidents", "--state", "open", token=READER)
    by_job = {i["job"]: i for i in incidents if i["kind"] == "slow_gpu"}
    assert by_job["muted-job"]["kind"] == "slow_gpu" and by_job["muted-job"]["ranks"] == [5]
    assert by_job["plain-job"]["kind"] == "slow_gpu" and by_job["plain-job"]["ranks"] == [5]
    # the tuned job's GPU is within its thresholds: the job is slower, with no culprit named
    assert "tuned-job" not in by_job, by_job.get("tuned-job")
    assert {i["kind"] for i in incidents if i["job"] == "tuned-job"} <= {"job_slowdown"}
    assert by_job["plain-job"]["onset"].endswith("Z")  # readable beside onset_ns

    # the plain job is notified; the muted one is not, and says why
    assert wait_for(lambda: cli(capsys, url, "get", "actions", "--job", "plain-job"), 30)
    muted_id = by_job["muted-job"]["id"]

    def muted_policy() -> str:
        return cli(capsys, url, "describe", "incident", muted_id)["evidence"].get("policy", "")

    assert "muted: drill" in wait_for(muted_policy, 30)
    assert cli(capsys, url, "get", "actions", "--job", "muted-job") == []

    # unmute: the open incident is announced now
    cli(capsys, url, "unmute", "muted-job", "--reason", "drill over")
    def ladder(job: str) -> list[dict[str, Any]]:  # the fleet's drain hint may come too
        return [a for a in cli(capsys, url, "get", "actions", "--job", job) if a["kind"] != "drain"]

    acts = wait_for(lambda: ladder("muted-job"), 30)
    assert acts[0]["kind"] == "notify"  # announced first; the ladder goes on from there

    # a proposed action rejected: the actor is the token's
    def proposed() -> list[dict[str, Any]]:
        found = cli(capsys, url, "get", "actions", "--job", "plain-job", "--state", "proposed")
        return [a for a in found if a["kind"] != "drain"]  # the fleet's hint may come too

    found = wait_for(proposed, 30)
    assert found, cli(capsys, url, "get", "incidents", "--job", "plain-job")[0]["evidence"].get(
        "policy"
    )
    action = found[0]
    assert action["kind"] in ("isolate", "restart") and action["mode"] == "manual"
    rejected = cli(capsys, url, "reject", action["id"], "--reason", "not during the eval run")
    assert rejected[0]["state"] == "rejected" and rejected[0]["decided_by"] == "alice"

    # resolve by hand, with the reason and the actor
    resolved = cli(capsys, url, "resolve", muted_id, "--reason", "GPU replaced")
    assert resolved[0]["state"] == "resolved" and resolved[0]["resolution"] == "manual"
    assert resolved[0]["evidence"]["resolution"] == {
        "closed_as": "manual",
        "by": "alice",
        "reason": "GPU replaced",
    }
    story = cli(capsys, url, "describe", "incident", muted_id)
    whats = [e["what"] for e in story["timeline"]]
    assert whats[0].startswith("onset") and any("resolve by alice" in w for w in whats)

    audit = cli(capsys, url, "get", "audit", token=READER)
    verbs = [(e["verb"], e["actor"], e["job"]) for e in audit]
    assert ("mute", "alice", "muted-job") in verbs and ("resolve", "alice", "muted-job") in verbs
    assert ("set", "alice", "tuned-job") in verbs and ("unmute", "alice", "muted-job") in verbs
    assert ("reject", "alice", "plain-job") in verbs

    # export: every incident and action, and the per-rank history, as CSV and Parquet. The jobs
    # are live (the ladder may propose meanwhile): what is exported holds every id listed just
    # before, and only ids listed just after
    def ids(what: str) -> set[str]:
        return {x["id"] for x in cli(capsys, url, "get", what)} if what != "history" else set()

    for what, fmt in (("incidents", "csv"), ("actions", "parquet"), ("history", "csv")):
        out = tmp_path / f"{what}.{fmt}"
        argv = ["export", what, "--format", fmt, "--out", str(out), "--url", url, "--token", READER]
        before = ids(what)
        assert main([*argv, *(["--job", "plain-job"] if what == "history" else [])]) == 0
        after = ids(what)
        if fmt == "csv":
            with out.open() as fh:
                rows = list(csv.DictReader(fh))
        else:
            rows = pq.read_table(out).to_pylist()
        if what == "incidents":
            assert before <= {r["id"] for r in rows} <= after
            assert all(r["onset_utc"] for r in rows) and json.loads(rows[0]["evidence"])
        elif what == "actions":
            assert before <= {r["id"] for r in rows} <= after and rows[0]["created_utc"]
        else:
            assert {r["rank"] for r in rows} == {str(r) for r in range(16)}
            assert all(float(r["step_time_s"]) > 0 for r in rows)
    capsys.readouterr()

    # a reader may look but not change: one line that says so
    with pytest.raises(SystemExit) as exc:
        main(["mute", "plain-job", "--reason", "x", "--url", url, "--token", READER])
    assert str(exc.value).startswith("failslow: this token may not do that")
    assert "\n" not in str(exc.value)


def test_pause_and_maintenance_stop_detection(
    service: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = service
    ctl = cli(capsys, url, "pause", "paused-job", "--reason", "benchmarking")
    assert ctl["paused"] and ctl["pause_reason"] == "benchmarking"
    ctl = cli(capsys, url, "maintenance", "window-job", "--for", "1h", "--reason", "swap")
    assert ctl["in_maintenance"] and ctl["muted"] and ctl["paused"]
    for job in ("paused-job", "window-job"):
        feed(url, job, "slow_gpu:rank=5,start=60,factor=2.0")
    assert cli(capsys, url, "get", "incidents", token=READER) == []
    # resumed: the next frames are analysed again
    cli(capsys, url, "resume", "paused-job", "--reason", "done")
    window = ctl["windows"][0]["id"]
    ctl = cli(capsys, url, "maintenance", "window-job", "--end-window", window, "--reason", "ok")
    assert not ctl["in_maintenance"] and not ctl["paused"]
