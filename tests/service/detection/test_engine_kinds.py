"""Every incident kind through the real app: engine, hang snapshots, persistence, REST."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from failslow.harness.simulator import Fault, Layout, Scenario
from failslow.harness.simulator.model import Noise
from failslow.service.app import create_app
from failslow.service.settings import Settings

L16 = Layout(tp=2, pp=2, dp=4, gpus_per_host=4)


def stream(db_url: str, sc: Scenario) -> tuple[list[dict], dict, dict]:  # type: ignore[type-arg]
    sim = sc.simulation()
    with TestClient(create_app(Settings(database_url=db_url))) as c:
        for env in sc.envelopes(sim):
            assert c.post("/v1/ingest", json=env).status_code == 200
        summary = c.post(f"/v1/jobs/{sc.job}/flush").json()
        incidents = c.get(f"/v1/jobs/{sc.job}/incidents").json()
    return incidents, summary, sc.labels(sim)


@pytest.mark.parametrize(
    "fault,kind,ranks,hosts,words",
    [
        (
            Fault("slow_node", 40, factor=1.5, hosts=("node-001",)),
            "slow_node",
            [4, 5, 6, 7],
            ["node-001"],
            "node-001 is slow: its 4 GPUs compute",
        ),
        (
            Fault("slow_nic", 40, factor=3.0, hosts=("node-002",)),
            "slow_link",
            [],
            ["node-002"],
            "The network link of node-002 is slow",
        ),
        (
            Fault("slow_link", 40, factor=3.0, hosts=("node-000", "node-002")),
            "slow_link",
            [],
            ["node-000", "node-002"],
            "The link between node-000 and node-002 is slow",
        ),
        (Fault("job_slowdown", 40, factor=1.3), "job_slowdown", [], [], "The whole job is"),
    ],
    ids=["node", "nic", "pair", "job"],
)
def test_slow_kinds(
    db_url: str, fault: Fault, kind: str, ranks: list[int], hosts: list[str], words: str
) -> None:
    sc = Scenario(job=f"k-{kind}", layout=L16, steps=80, noise=Noise(), faults=(fault,), seed=4)
    incidents, summary, labels = stream(db_url, sc)
    assert [(i["kind"], i["ranks"], i["hosts"]) for i in incidents] == [(kind, ranks, hosts)]
    inc = incidents[0]
    # the 3rd slow step for a 1.5x node, a 3x NIC or cable (severe, issue 32), else the 4th
    # at the earliest (a job slowdown: ~6 slow steps, issue 16)
    if kind == "job_slowdown":
        assert inc["onset_step"] == 40 and inc["detected_step"] in range(43, 47)
    else:
        assert (inc["onset_step"], inc["detected_step"]) == (40, 42)
    assert inc["detected_ns"] > labels["faults"][0]["onset_ns"]
    assert inc["summary"].startswith(words) and "since step 40" in inc["summary"]
    assert summary["state"] == "degraded" and summary["open_incidents"] == 1


@pytest.mark.parametrize(
    "fault,roots,hosts",
    [
        (Fault("hang", 40, ranks=(9,)), [9], ["node-002"]),
        (Fault("dead_host", 40, hosts=("node-003",)), [12, 13, 14, 15], ["node-003"]),
    ],
    ids=["stuck-rank", "dead-host"],
)
def test_hangs(db_url: str, fault: Fault, roots: list[int], hosts: list[str]) -> None:
    sc = Scenario(
        job="k-hang", layout=L16, steps=70, noise=Noise(), faults=(fault,), seed=4, hang_tail_s=15
    )
    incidents, summary, labels = stream(db_url, sc)
    assert [(i["kind"], i["ranks"], i["hosts"]) for i in incidents] == [("hang", roots, hosts)]
    inc = incidents[0]
    delay = (inc["detected_ns"] - labels["faults"][0]["onset_ns"]) / 1e9
    assert 0 < delay < 10
    assert inc["summary"].startswith("Job hung since") and f"rank {roots[0]}" in inc["summary"]
    assert inc["evidence"]["blocked"] and inc["evidence"]["detector"] == "hang"
    assert summary["state"] == "hung"


def test_a_lagging_agent_is_not_a_fault(db_url: str) -> None:
    """One host's envelopes arrive 15 s (event time) behind the others: no incident of any kind."""
    sc = Scenario(job="lag", layout=L16, steps=100, noise=Noise(), seed=5)
    envs = list(sc.envelopes())
    lagging = [e for e in envs if e["host"] == "node-002"]
    others = [e for e in envs if e["host"] != "node-002"]
    order = sorted(
        others + lagging,
        key=lambda e: e["sent_ns"] + (15_000_000_000 if e["host"] == "node-002" else 0),
    )
    with TestClient(create_app(Settings(database_url=db_url))) as c:
        for env in order:
            assert c.post("/v1/ingest", json=env).status_code == 200
        c.post("/v1/jobs/lag/flush")
        assert c.get("/v1/jobs/lag/incidents").json() == []
