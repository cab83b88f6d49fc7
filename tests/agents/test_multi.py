"""One agent process for every job on a node: two jobs' processes send to one socket, each job
gets its own outbox and stream and arrives whole; an agent restarted with envelopes still in a
job's outbox delivers them; past max_jobs records are refused and counted. And the real
``failslow agent`` without --job, as the Helm chart's DaemonSet runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

from failslow.agents.agent import NodeAgent
from failslow.agents.multi import JobAgents
from failslow.agents.sdk import Recorder
from failslow.service.settings import Settings
from tests.agents.test_agent import feed
from tests.live import free_port, live_service, wait_for


def accepted(url: str, job: str) -> int:
    r = httpx.get(f"{url}/v1/jobs/{job}")
    return sum(h["accepted"] for h in r.json()["ingest"].values()) if r.status_code == 200 else 0


def make(url: str):  # type: ignore[no-untyped-def]
    def agent(job: str, state_dir: Path) -> NodeAgent:
        return NodeAgent(service=url, job=job, host="h0", socket_path=None,
                         state_dir=str(state_dir), flush_interval_s=0.1, heartbeat_s=0.5,
                         fsync=False, backoff_cap_s=0.3)  # fmt: skip

    return agent


def test_two_jobs_one_socket(tmp_path: Path, db_url: str) -> None:
    sock = str(tmp_path / "all.sock")
    with live_service(Settings(database_url=db_url)) as url:
        agents = JobAgents(socket_path=sock, state_root=tmp_path / "state", make_agent=make(url),
                           max_jobs=2, socket_mode=0o666).start()  # fmt: skip
        try:
            recs = [Recorder(job, socket_path=sock, flush_interval_s=0.01)
                    for job in ("job-a", "job-b", "job-c")]  # fmt: skip
            for rec in recs:
                feed(rec, 300)
                assert rec.flush(timeout_s=30)
            for job in ("job-a", "job-b"):
                assert wait_for(lambda j=job: accepted(url, j) == 600, 30), accepted(url, job)
            assert set(agents.agents) == {"job-a", "job-b"}  # the third is past max_jobs
            assert Path(sock).stat().st_mode & 0o777 == 0o666
            assert agents.refused_jobs >= 600 and accepted(url, "job-c") == 0
            assert (tmp_path / "state" / "job-a" / "agent.json").exists()
            ok, info = agents.health()
            assert ok and set(info["jobs"]) == {"job-a", "job-b"}  # type: ignore[arg-type]
            for rec in recs:
                rec.close()
        finally:
            agents.stop(drain_timeout_s=1)


def test_a_restart_delivers_what_an_outbox_kept(tmp_path: Path, db_url: str) -> None:
    sock = str(tmp_path / "all.sock")
    port = free_port()
    down = f"http://127.0.0.1:{port}"
    agents = JobAgents(socket_path=sock, state_root=tmp_path / "state", make_agent=make(down))
    agents.start()
    rec = Recorder("kept", socket_path=sock, flush_interval_s=0.01)
    feed(rec, 200)
    assert rec.flush(timeout_s=30)
    assert wait_for(
        lambda: "kept" in agents.agents and agents.agents["kept"].stats.records_sealed == 400, 10
    )
    agents.stop(drain_timeout_s=0.2)  # the service is down: the envelopes stay in the outbox
    rec.close()
    with live_service(Settings(database_url=db_url), port=port) as url:
        again = JobAgents(socket_path=sock, state_root=tmp_path / "state", make_agent=make(url))
        again.start()  # no payload yet: the job is started from its outbox
        try:
            assert wait_for(lambda: accepted(url, "kept") == 400, 30), accepted(url, "kept")
        finally:
            again.stop(drain_timeout_s=1)


def test_the_agent_command_without_a_job(tmp_path: Path, db_url: str) -> None:
    sock = str(tmp_path / "node.sock")
    metrics = free_port()
    log = tmp_path / "agent.log"
    with live_service(Settings(database_url=db_url)) as url, log.open("wb") as log_fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "failslow.cli", "agent", "--service", url, "--host", "n1",
             "--socket", sock, "--state-dir", str(tmp_path / "st"), "--flush-interval", "0.1",
             "--no-fsync", "--metrics-listen", f"127.0.0.1:{metrics}"],
            stdout=subprocess.DEVNULL, stderr=log_fh,
        )  # fmt: skip
        try:
            assert wait_for(lambda: Path(sock).exists(), 30)
            recs = [Recorder(j, socket_path=sock, flush_interval_s=0.01) for j in ("x1", "x2")]
            for rec in recs:
                feed(rec, 100)
                assert rec.flush(timeout_s=30)
            for job in ("x1", "x2"):
                assert wait_for(lambda j=job: accepted(url, j) == 200, 30)
            text = httpx.get(f"http://127.0.0.1:{metrics}/metrics").text
            assert 'failslow_agent_records_accepted_total{training_job="x1",host="n1"} 200' in text
            assert "failslow_agent_jobs 2" in text
            assert httpx.get(f"http://127.0.0.1:{metrics}/healthz").status_code == 200
            for rec in recs:
                rec.close()
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0, log.read_text()[-2000:]
    argv = [sys.executable, "-m", "failslow.cli", "agent", "--service", "http://x",
            "--input-dir", str(tmp_path)]  # fmt: skip
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--input-dir needs --job" in r.stderr
