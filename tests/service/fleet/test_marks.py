"""Where the ledger's incident marks land: a slow link that active probes narrowed to one end
moves its mark (and its counts) off the other end's NIC; a qualification that finds a host's link
slow marks its NIC, one that finds a GPU slow marks that GPU, and two such runs make either a
repeat offender (suspect)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from failslow.agents.wire import encode_envelope
from failslow.cli.output import emit
from failslow.harness.simulator import Layout, Scenario
from failslow.service.app import create_app
from failslow.service.db import session_scope
from failslow.service.fleet.qualify import TaskKind
from failslow.service.fleet.settings import FleetSettings
from failslow.service.incidents.models import Incident
from failslow.service.metrics import Event
from failslow.service.probes.manager import Campaign, Task
from failslow.service.settings import DetectionSettings, Settings

MB = 1e6


@pytest.fixture
def c(tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(database_url=f"sqlite:///{tmp_path}/marks.db",
                        detection=DetectionSettings(interval_s=0.05),
                        fleet=FleetSettings(flush_interval_s=3600))  # fmt: skip
    with TestClient(create_app(settings)) as client:
        yield client


def small_job(c: TestClient, job: str) -> tuple[str, str]:
    """A healthy 2-host job (so that the job and its hosts are known); its host names."""
    scenario = Scenario(job=job, layout=Layout(tp=2, pp=1, dp=4, gpus_per_host=4), steps=30)
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    for env in scenario.envelopes(scenario.simulation()):
        r = c.post("/v1/ingest", content=encode_envelope(env), headers=headers)
        assert r.status_code == 200, r.text
    assert c.post(f"/v1/jobs/{job}/flush").status_code == 200
    a, b = scenario.layout.hosts
    return a, b


def nic(c: TestClient, host: str) -> dict[str, object]:
    r = c.get(f"/v1/fleet/nics/{host}/net")
    assert r.status_code == 200, r.text
    body: dict[str, object] = r.json()
    return body


def test_a_probed_slow_link_moves_its_mark_to_the_slow_end(
    c: TestClient, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = small_job(c, "mk-1")
    ctx = c.app.state.ctx  # type: ignore[attr-defined]
    onset = Scenario().t0_ns + 10**9  # in the job's event time: its cost grows to its now
    with session_scope(ctx.sessions) as s:
        s.add(Incident(id="inc_link1", job_id="mk-1", kind="slow_link", subject=f"{a}|{b}",
                       state="open", ranks=[], hosts=[a, b], slowdown=1.3, subject_slowdown=3.0,
                       confidence=0.8, severity="major", onset_ns=onset,
                       detected_ns=onset + 2 * 10**9, resolved_ns=None, onset_step=10,
                       detected_step=12, resolved_step=None, summary="slow link", evidence={},
                       updated_ns=onset))  # fmt: skip
    ctx.fleet.sink(Event.INCIDENT_OPENED, {"incident": "inc_link1"})
    assert c.post("/v1/fleet/flush").status_code == 200
    for h in (a, b):  # passive data blames both ends
        part = nic(c, h)
        assert part["incidents"] == 1 and [m["incident"] for m in part["marks"]] == ["inc_link1"]
    named = c.get("/v1/fleet/incidents/inc_link1").json()
    assert [(p["kind"], p["part"]) for p in named] == [("nic", f"{a}/net"), ("nic", f"{b}/net")]
    with session_scope(ctx.sessions) as s:  # what a finished probe campaign writes
        inc = s.get(Incident, "inc_link1")
        assert inc is not None
        inc.hosts = [b]
        inc.evidence = {"probes": {"component": f"host:{b}", "hosts": [b]}}
    assert c.post("/v1/fleet/flush").status_code == 200
    cleared, blamed = nic(c, a), nic(c, b)
    assert cleared["incidents"] == 0 and cleared["marks"] == [], cleared
    assert cleared["cost_s"] == 0.0 and blamed["cost_s"] > 0, (cleared, blamed)
    [m] = blamed["marks"]
    assert m["incident"] == "inc_link1" and blamed["incidents"] == 1
    [named] = c.get("/v1/fleet/incidents/inc_link1").json()
    assert named["part"] == f"{b}/net" and named["lost_s"] == m["lost_s"]
    # what `failslow describe incident` prints of it
    inc = {**c.get("/v1/incidents/inc_link1").json(), "hardware": [named]}
    emit("incident", inc, "table")
    assert f"  nic {b}/net on {b}: healthy in the fleet" in capsys.readouterr().out


def test_failed_link_qualifications_mark_the_nic_and_make_it_suspect(c: TestClient) -> None:
    a, b = small_job(c, "mk-2")
    hosts = [a, b, "node-x"]
    for _ in range(2):  # two runs, each measuring host b's links at 3 MB/s against ~900
        run = c.post("/v1/fleet/qualifications", json={"hosts": hosts, "timeout_s": 60}).json()
        for rnd in range(2):  # the agents poll (the first round says their endpoints)
            for i, h in enumerate(hosts):
                addr = {"probe_addr": f"10.0.0.{i}:7000"} if rnd == 0 else {}
                for t in c.get(f"/v1/fleet/agents/{h}/tasks", params=addr).json()["tasks"]:
                    slow = b in (h, t.get("peer"))
                    result = ({"seconds": 0.2} if t["kind"] == TaskKind.COMPUTE
                              else {"bps": 3 * MB if slow else 900 * MB})  # fmt: skip
                    url = f"/v1/fleet/qualifications/{run['id']}/tasks/{t['id']}"
                    assert c.post(url, json=result).status_code == 204
        view = c.get(f"/v1/fleet/qualifications/{run['id']}").json()
        assert view["state"] == "done" and view["no_go"] == [b], view
        assert c.post("/v1/fleet/flush").status_code == 200
    part = nic(c, b)
    assert part["incidents"] == 2 and {m["kind"] for m in part["marks"]} == {"slow_link"}
    assert all(m["job"].startswith("qual_") for m in part["marks"])
    assert part["state"] == "suspect" and "named by incidents in 2 jobs" in part["state_reason"]
    assert nic(c, a)["incidents"] == 0  # its one slow pair is b's


def qualify(c: TestClient, hosts: list[str], bps: Callable[[str, str], float]) -> dict[str, Any]:
    """One qualification through the REST, the agents answering ``bps(host, peer)``."""
    run = c.post("/v1/fleet/qualifications", json={"hosts": hosts, "timeout_s": 60}).json()
    for rnd in range(2):  # the agents poll (the first round says their endpoints)
        for i, h in enumerate(hosts):
            addr = {"probe_addr": f"10.0.1.{i}:7000"} if rnd == 0 else {}
            for t in c.get(f"/v1/fleet/agents/{h}/tasks", params=addr).json()["tasks"]:
                result = ({"seconds": 0.2} if t["kind"] == TaskKind.COMPUTE
                          else {"bps": bps(h, t["peer"])})  # fmt: skip
                url = f"/v1/fleet/qualifications/{run['id']}/tasks/{t['id']}"
                assert c.post(url, json=result).status_code == 204
    view: dict[str, Any] = c.get(f"/v1/fleet/qualifications/{run['id']}").json()
    assert view["state"] == "done"
    return view


def test_a_nic_that_passes_every_qualification_but_is_always_slower_is_flagged(
    c: TestClient,
) -> None:
    """A NIC at 62% of its peers' link speed is above the no-go bar (half the norm) in every
    qualification; its checks, pooled in the ledger, flag it within a few runs, and nothing
    else is flagged."""
    hosts = [f"q{i}" for i in range(5)]
    rng = np.random.default_rng(5)

    def bps(a: str, b: str) -> float:
        slow = 0.62 if "q3" in (a, b) else 1.0
        return 900 * MB * slow * float(np.exp(rng.normal(0, 0.05)))

    flagged_at = None
    for k in range(1, 9):
        view = qualify(c, hosts, bps)
        if flagged_at is None:
            assert view["go"] == hosts, view  # no single run says no-go
        else:  # once the ledger flags its NIC, qualification says so
            [why] = [h["reasons"] for h in view["hosts"] if h["host"] == "q3"]
            assert view["no_go"] == ["q3"] and why[0].startswith("fleet ledger: nic q3/net")
        assert c.post("/v1/fleet/flush").status_code == 200
        others = [nic(c, h) for h in hosts if h != "q3"]
        assert not any(p["flagged"] for p in others), others
        if flagged_at is None and nic(c, "q3")["flagged"]:
            flagged_at = k
    assert flagged_at is not None and 3 <= flagged_at <= 7, flagged_at  # 6 at this seed
    part = nic(c, "q3")
    assert part["state"] == "suspect" and "over" in part["state_reason"]
    assert part["state_reason"].startswith("links ") and "link checks" in part["state_reason"]
    assert part["jobs_seen"] == 0 and part["jobs"] == 8  # 8 link checks; runs are not jobs
    readings = part["readings"]
    assert isinstance(readings, list) and len(readings) == 8
    assert all(r["source"] == "link_check" for r in readings)


def test_probe_campaigns_read_nic_speeds_into_the_ledger(c: TestClient) -> None:
    """A finished probe campaign's pairs are link checks of the NICs they measured: a NIC
    slow in three campaigns is flagged; a host in one pair only gets no reading."""
    a, b = small_job(c, "mk-3")
    ctx = c.app.state.ctx  # type: ignore[attr-defined]
    hosts = [a, b, "p2", "p3"]
    for i in range(3):
        camp = Campaign(f"cmp_{i}", "mk-3", "inc_none", hosts, [], started_ns=0)
        pairs = [(a, b), ("p2", "p3"), (a, "p2"), (b, "p3"), ("p3", "lonely")]
        for x, y in pairs:
            speed = 0.4 if "p3" in (x, y) else 1.0
            camp.done.append(Task(f"t{i}{x}{y}", x, y, state="done", bps=900 * MB * speed))
        ctx.probes._finish(camp, now=10**18 + i)  # (what the campaign's last round calls)
        assert c.post("/v1/fleet/flush").status_code == 200
    assert nic(c, "p3")["flagged"] and nic(c, "p3")["state"] == "suspect"
    assert not any(nic(c, h)["flagged"] for h in (a, b, "p2"))
    assert c.get("/v1/fleet/nics/lonely/net").status_code == 404


def test_a_gpu_slow_in_two_qualifications_is_marked_and_suspect(c: TestClient) -> None:
    """A GPU over its model's norm makes its host no-go and marks that GPU (by the UUID the
    inventory gives it, whatever its index in the check); twice makes it a repeat offender."""
    model = "cuda: NVIDIA H100 80GB HBM3"
    hosts = ["gq0", "gq1", "gq2"]
    for h in hosts:  # the inventory's UUIDs; the check reports gq1's GPU 2 by its UUID
        gpus = [{"index": g, "uuid": f"GPU-{h}-{g}"} for g in range(4)]
        r = c.put(f"/v1/fleet/hosts/{h}/hardware", json={"gpus": gpus, "nics": []})
        assert r.status_code in (200, 204), r.text

    def result(h: str) -> dict[str, Any]:
        secs = [0.056 if (h, g) == ("gq1", 2) else 0.040 for g in range(4)]
        per = [{"index": (g + 1) % 4, "uuid": f"GPU-{h}-{g}", "device": model, "seconds": s}
               for g, s in enumerate(secs)]  # (CUDA's order need not be the inventory's)
        return {"seconds": max(secs), "device": model, "gpus": per}

    for _ in range(2):
        run = c.post("/v1/fleet/qualifications", json={"hosts": hosts, "timeout_s": 60}).json()
        for rnd in range(2):
            for i, h in enumerate(hosts):
                addr = {"probe_addr": f"10.0.2.{i}:7000"} if rnd == 0 else {}
                for t in c.get(f"/v1/fleet/agents/{h}/tasks", params=addr).json()["tasks"]:
                    body = result(h) if t["kind"] == TaskKind.COMPUTE else {"bps": 900 * MB}
                    url = f"/v1/fleet/qualifications/{run['id']}/tasks/{t['id']}"
                    assert c.post(url, json=body).status_code == 204
        view = c.get(f"/v1/fleet/qualifications/{run['id']}").json()
        assert view["no_go"] == ["gq1"], view
        assert view["hosts"][1]["reasons"][0].startswith("GPU 3 (GPU-gq1-2) compute 0.056 s")
        assert c.post("/v1/fleet/flush").status_code == 200
    part = c.get("/v1/fleet/gpus/GPU-gq1-2").json()
    assert part["incidents"] == 2 and {m["kind"] for m in part["marks"]} == {"slow_gpu"}
    assert part["state"] == "suspect" and "named by incidents in 2 jobs" in part["state_reason"]
    others = c.get("/v1/fleet/gpus?limit=100").json()
    assert [p["part"] for p in others if p["incidents"]] == ["GPU-gq1-2"]
    assert all(p["incidents"] == 0 for p in c.get("/v1/fleet/nics?limit=100").json())
