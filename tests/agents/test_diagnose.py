"""Hang evidence from the node: Flight Recorder dumps (the real ones in ../shared, and one asked
for through a named pipe as PyTorch's watchdog would answer it), NCCL RAS through a command, and
the service's join of the hosts' reports (PyTorch's reference: rank 12 never enqueued all_to_all
#20537 of process group 74)."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import httpx
import pytest

from failslow.agents.diagnose import collect, trigger
from failslow.agents.probe import ProbeWorker
from failslow.service.db import make_engine, make_sessionmaker, session_scope
from failslow.service.incidents.service import IncidentDraft, open_incident
from failslow.service.probes.hang_evidence import HangEvidenceIn, merge
from failslow.service.settings import ActionsSettings, DetectionSettings, Settings
from tests.helpers import SHARED, T0, envelope
from tests.live import live_service, wait_for

FIX = SHARED / "fixtures" / "telemetry"
DUMPS = FIX / "flight-recorder-pickle"
pytestmark = pytest.mark.skipif(not DUMPS.exists(), reason=f"fixtures not found at {FIX}")


def test_real_dumps_name_the_rank_the_others_wait_for() -> None:
    ev = collect(list(range(16)), dump_prefix=f"{DUMPS}/_dump_")
    assert ev["errors"] == [] and sorted(ev["flight_recorder"]) == list(range(16))
    merged = merge({}, HangEvidenceIn(host="node-0", **ev))
    first = merged["flight_recorder"]["first"]
    assert first["group"] == "74" and first["ranks"] == [12] and first["stuck_seq"] == 20537
    assert first["desc"] == "EXPERT_MODEL_PARALLEL_GROUP"
    assert "ranks [12] never enqueued collective #20537" in merged["flight_recorder"]["note"]


def test_hosts_reports_are_joined() -> None:
    a = collect(list(range(8)), dump_prefix=f"{DUMPS}/_dump_")
    b = collect(list(range(8, 16)), dump_prefix=f"{DUMPS}/_dump_")
    ev = merge(merge({}, HangEvidenceIn(host="node-0", **a)), HangEvidenceIn(host="node-1", **b))
    assert ev["flight_recorder"]["hosts"] == ["node-0", "node-1"]
    assert ev["flight_recorder"]["first"]["ranks"] == [12]


def test_missing_and_garbage_dumps_are_errors_not_crashes(tmp_path: Path) -> None:
    (tmp_path / "d1").write_bytes(b"\x80\x04garbage")
    ev = collect([0, 1], dump_prefix=str(tmp_path / "d"), wait_s=0.2)
    assert ev["flight_recorder"] == {} and len(ev["errors"]) == 2
    assert "no dump" in ev["errors"][0] and "rank 1" in ev["errors"][1]


def test_a_dump_asked_for_through_the_pipe(tmp_path: Path) -> None:
    # PyTorch's watchdog reads TORCH_NCCL_DEBUG_INFO_PIPE_FILE<rank>.pipe and writes the dump to
    # TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>; this thread does the same (no NCCL here)
    pipe = tmp_path / "pipe_3.pipe"
    os.mkfifo(pipe)

    def watchdog() -> None:
        with open(pipe) as f:
            assert f.readline().strip() == "1"
        shutil.copy(DUMPS / "_dump_3", tmp_path / "dump_3")

    t = threading.Thread(target=watchdog, daemon=True)
    t.start()
    time.sleep(0.3)  # let the reader open the pipe
    ev = collect(
        [3],
        dump_prefix=str(tmp_path / "dump_"),
        pipe_prefix=str(tmp_path / "pipe_"),
        since_ns=T0,
        wait_s=10,
    )
    t.join(timeout=5)
    assert ev["errors"] == [] and list(ev["flight_recorder"]) == [3]
    assert trigger(str(tmp_path / "nopipe_"), 0) is False  # no pipe: nothing to ask


def test_nccl_ras_through_a_command() -> None:
    ev = collect([0], ras_cmd=f"cat {FIX / 'nccl-ras-status.json'}")
    assert ev["nccl_ras"] == {1: "unresponsive"} and ev["errors"] == []
    ev = collect([0], ras_cmd="false")
    assert ev["nccl_ras"] == {} and "nccl ras: exit 1" in ev["errors"][0]


def test_agents_report_hang_evidence_into_the_incident(db_url: str, tmp_path: Path) -> None:
    settings = Settings(
        database_url=db_url,
        detection=DetectionSettings(interval_s=0.05),
        actions=ActionsSettings(enabled=False),
    )
    with live_service(settings) as url:
        env = envelope(job="hung", host="node-0", ranks=[{"rank": 0, "world_size": 16}])
        assert httpx.post(f"{url}/v1/ingest", json=env).status_code == 200
        with session_scope(make_sessionmaker(make_engine(db_url))) as s:
            inc, _ = open_incident(
                s,
                draft=IncidentDraft(
                    job="hung", kind="hang", subject="job", ranks=[12], hosts=["node-1"],
                    slowdown=None, subject_slowdown=None, confidence=0.9, onset_ns=T0,
                    detected_ns=T0, onset_step=None, detected_step=None,
                    summary="Job hung.", evidence={},
                ),
                now_ns=T0,
            )  # fmt: skip
            incident = inc.id
        workers = [
            ProbeWorker(
                service=url, job="hung", host=f"node-{i}", poll_s=0.2,
                ranks=lambda i=i: list(range(8 * i, 8 * i + 8)),
                dump_prefix=f"{DUMPS}/_dump_",
                ras_cmd=f"cat {FIX / 'nccl-ras-status.json'}" if i == 0 else None,
            ).start()
            for i in range(2)
        ]  # fmt: skip
        try:

            def joined() -> bool:
                ev = httpx.get(f"{url}/v1/incidents/{incident}").json()["evidence"]
                return ev.get("flight_recorder", {}).get("hosts") == ["node-0", "node-1"]

            assert wait_for(joined, timeout=30)
        finally:
            for w in workers:
                w.stop()
        got = httpx.get(f"{url}/v1/incidents/{incident}").json()
        assert got["evidence"]["flight_recorder"]["first"]["ranks"] == [12]
        assert got["evidence"]["nccl_ras"]["suspects"] == {"1": "unresponsive"}
        assert got["summary"].count("Flight Recorder:") == 1  # the newest note replaced the old
        assert "never enqueued collective #20537" in got["summary"]
        assert "NCCL RAS: rank 1 unresponsive." in got["summary"]
        assert sum(w.hang_reports for w in workers) == 2  # each asked once
        r = httpx.post(f"{url}/v1/jobs/hung/incidents/inc_nope/hang-evidence", json={"host": "x"})
        assert r.status_code == 404
