"""A NIC's speed from jobs' own collectives, through a real service: a NIC 1.4x slower in every
job (no job opens an incident for it) is flagged by the ledger after a few jobs, and priced by
what its transfers lost; no other is."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from failslow.harness.fleet import client_sender
from failslow.harness.simulator import Fault, Layout, Scenario
from failslow.service.app import create_app
from failslow.service.fleet.settings import FleetSettings
from failslow.service.settings import DetectionSettings, Settings

# 4 hosts of 4 GPUs: two pipeline stages of two hosts, data parallel within a stage; each host's
# communicators (its stage's rings, its pipeline pairs) share no other host
LAYOUT = Layout(tp=2, pp=2, dp=4, gpus_per_host=4)
HOSTS = ["pa", "pb", "pc", "pd", "pe"]
SLOW = "pc"


def test_a_chronically_slow_nic_is_flagged_from_passive_readings(tmp_path: Path) -> None:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path}/fleet.db",
        detection=DetectionSettings(interval_s=0.2),
        fleet=FleetSettings(flush_interval_s=3600),
    )
    flagged_at = None
    with TestClient(create_app(settings)) as c:
        send = client_sender(c)
        for host in HOSTS:
            send("PUT", f"/v1/fleet/hosts/{host}/hardware",
                 {"gpus": [{"index": g} for g in range(4)],
                  "nics": [{"name": "mlx5_0", "kind": "infiniband"}]})  # fmt: skip
        for j in range(5):
            placed = [HOSTS[(j + i) % len(HOSTS)] for i in range(4)]  # SLOW in 4 of 5 jobs
            name = LAYOUT.hosts[placed.index(SLOW)] if SLOW in placed else None
            faults = (Fault("slow_nic", 0, factor=1.4, hosts=(name,)),) if name else ()
            job = f"passive-{j}"
            sc = Scenario(job=job, layout=LAYOUT, steps=120, faults=faults, seed=40 + j,
                          t0_ns=1_780_000_000_000_000_000 + j * 3_600_000_000_000)  # fmt: skip
            rename = dict(zip(LAYOUT.hosts, placed, strict=True))
            for env in sc.envelopes(sc.simulation()):
                send("POST", "/v1/ingest", {**env, "host": rename[env["host"]]})
            send("POST", f"/v1/jobs/{job}/flush", None)
            assert c.get("/v1/incidents").json() == []  # no job's detectors see it
            send("POST", "/v1/fleet/flush", None)
            nics = {n["part"]: n for n in c.get("/v1/fleet/nics?limit=100").json()}
            assert [p for p, n in nics.items() if n["flagged"] and p != f"{SLOW}/mlx5_0"] == []
            if flagged_at is None and nics[f"{SLOW}/mlx5_0"]["flagged"]:
                flagged_at = j + 1
        slow = c.get(f"/v1/fleet/nics/{SLOW}/mlx5_0").json()
        healthy = c.get("/v1/fleet/nics/pa/mlx5_0").json()
        by_cost = c.get("/v1/fleet/nics?sort=cost").json()
    assert flagged_at is not None and flagged_at <= 5, slow
    assert slow["state"] == "suspect" and "jobs" in slow["state_reason"], slow
    assert 1.25 <= slow["slowness"] <= 1.45, slow
    assert all(r["frames"] >= 100 and r["source"] == "job" and r["lost_s"] > 0
               for r in slow["readings"]), slow  # fmt: skip
    assert healthy["readings"] and abs(healthy["slowness"] - 1) < 0.05, healthy
    # priced by what its transfers lost (the simulator's truth for this NIC in these jobs:
    # ~0.9 s per job, 3.5 s in all; priced at its credible slowness, less), ranked first by it
    assert by_cost[0]["part"] == f"{SLOW}/mlx5_0" and 1.0 <= by_cost[0]["cost_s"] <= 3.5, by_cost
    assert all(n["cost_s"] == 0 for n in by_cost[1:]), by_cost
