"""The fleet ledger through a real service: a small simulated fleet, its REST, drain and return."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from failslow.harness.fleet import FleetSpec, client_sender, run_fleet, score
from failslow.service.app import create_app
from failslow.service.fleet.settings import FleetSettings
from failslow.service.settings import DetectionSettings, Settings

SPEC = FleetSpec(hosts=8, jobs=9, job_hosts=(2, 3), steps=(110, 130), slow_gpus=1,
                 slow_gpu_factor=1.08, slow_nic_share=0.3, fail_after_jobs=1, repair_jobs=1,
                 seed=3)  # fmt: skip


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, Any]]:
    d: Path = tmp_path_factory.mktemp("fleet")
    settings = Settings(
        database_url=f"sqlite:///{d}/fleet.db",
        detection=DetectionSettings(interval_s=0.2),
        fleet=FleetSettings(flush_interval_s=3600, probation_s=60, probation_jobs=1),
    )
    with TestClient(create_app(settings)) as c:
        yield c, run_fleet(SPEC, client_sender(c), progress=False)


def test_faulty_hardware_is_found_and_nothing_healthy_is_flagged(
    fleet: tuple[TestClient, Any],
) -> None:
    c, run = fleet
    result = score(run, SPEC)
    assert result["false_flags"] == [] and result["ever_flagged_healthy"] == []
    # a slow link blames both of its ends until other partners tell them apart: the slow NIC
    # costs the most of all NICs, tied at most with the partner of its one incident here
    nic = f"{run.truth.slow_nic_host}/mlx5_0"
    nics = {n["part"]: n for n in run.final["nics"]}
    assert nics[nic]["incidents"] >= 1 and nics[nic]["cost_s"] > 0, result
    assert nics[nic]["cost_s"] == max(n["cost_s"] for n in nics.values()), result
    gpu = result["parts"][run.truth.slow_gpus[0]]
    assert gpu["rank_by_cost"] == 1 and gpu["slowness"] > 1.03, result
    # the host that failed hard went out, came back from repair, ran clean
    assert result["failing_host"]["states"] == ["healthy", "failed", "probation", "healthy"], result
    host = c.get(f"/v1/fleet/hosts/{run.truth.failing_host}").json()
    assert any(m["kind"] == "hang" and m["hard"] for m in host["marks"])
    assert host["readings"] and all(r["frames"] > 0 for r in host["readings"])


def test_identities_come_from_the_inventory(fleet: tuple[TestClient, Any]) -> None:
    c, run = fleet
    gpus = c.get("/v1/fleet/gpus?sort=name").json()
    assert gpus and all(g["id_source"] == "uuid" and g["part"].startswith("GPU-") for g in gpus)
    slow = c.get(f"/v1/fleet/gpus/{run.truth.slow_gpus[0]}").json()
    assert slow["host"] == run.truth.gpu_host[run.truth.slow_gpus[0]]
    assert all(r["ratio"] > 1.0 for r in slow["readings"])  # every job it ran in saw it
    inv = c.get(f"/v1/fleet/hosts/{run.truth.failing_host}/hardware").json()
    assert len(inv["gpus"]) == 8 and inv["nics"][0]["name"] == "mlx5_0"
    nics = c.get("/v1/fleet/nics").json()
    assert {n["part"].split("/")[1] for n in nics} == {"mlx5_0"}


def test_drain_and_return_are_audited_and_checked(fleet: tuple[TestClient, Any]) -> None:
    c, run = fleet
    healthy = next(h for h in c.get("/v1/fleet/hosts?state=healthy").json())
    name = healthy["part"]
    r = c.post(f"/v1/fleet/hosts/{name}/return", json={"reason": "nothing to return"})
    assert r.status_code == 409 and "needs one of" in r.json()["detail"]
    r = c.post(f"/v1/fleet/hosts/{name}/drain", json={"reason": "fan noise"})
    assert r.status_code == 200 and r.json()["state"] == "failed"
    assert "fan noise" in r.json()["state_reason"]
    assert name in {h["part"] for h in c.get("/v1/fleet/hosts?state=failed").json()}
    r = c.post(f"/v1/fleet/hosts/{name}/return", json={"reason": "fan replaced"})
    assert r.json()["state"] == "probation"
    verbs = [(e["verb"], e["target"]) for e in c.get("/v1/audit").json()]
    assert ("drain", name) in verbs and ("return", name) in verbs
    assert c.get("/v1/fleet/hosts/no-such-host").status_code == 404
    assert c.get("/v1/fleet/disks").status_code == 422
    assert c.post(f"/v1/fleet/hosts/{name}/drain", json={}).status_code == 422  # a reason


def test_gauges_are_bounded_and_name_the_worst_parts(fleet: tuple[TestClient, Any]) -> None:
    c, run = fleet
    text = c.get("/metrics").text
    series = [ln for ln in text.splitlines() if ln.startswith("failslow_fleet_part_health{")]
    # gauges_top (50) per kind bounds them; this fleet has 8 hosts, 64 GPUs, 8 NICs
    assert 0 < len(series) <= 50 + 50 + 50
    slow = run.truth.slow_gpus[0]
    line = next(ln for ln in text.splitlines()
                if ln.startswith("failslow_fleet_part_slowness_ratio{") and slow in ln)  # fmt: skip
    assert float(line.rsplit(" ", 1)[1]) > 1.03
    counts = {ln.split("{", 1)[1].rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1])
              for ln in text.splitlines() if ln.startswith("failslow_fleet_parts{")}  # fmt: skip
    gpus = sum(v for k, v in counts.items() if 'kind="gpu"' in k)
    assert gpus == len(c.get("/v1/fleet/gpus?limit=10000").json())
