"""The fleet with the operator CLI against a real service (uvicorn, SQLite): a simulated job on
hosts whose inventories the agents reported, then `get gpus --sort cost`, `describe gpu`,
`drain host` / `return host` (audited), and the table an operator reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from failslow.agents.wire import encode_envelope
from failslow.cli import main
from failslow.harness.simulator.layout import Layout
from failslow.harness.simulator.scenario import Scenario, parse_fault
from failslow.service.fleet.settings import FleetSettings
from failslow.service.settings import DetectionSettings, Settings
from tests.live import live_service


def cli(capsys: pytest.CaptureFixture[str], url: str, *argv: str, out: str = "json") -> Any:
    rc = main([*argv, "--url", url, "-o", out])
    text = capsys.readouterr().out
    assert rc == 0, text
    return json.loads(text) if out == "json" else text


def test_fleet_with_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path}/fleet.db",
        detection=DetectionSettings(interval_s=0.05),
        fleet=FleetSettings(flush_interval_s=3600),
    )
    layout = Layout(tp=2, pp=2, dp=4, gpus_per_host=4)
    scenario = Scenario(job="cli-fleet", layout=layout, steps=160, seed=3,
                        faults=(parse_fault("slow_gpu:rank=5,start=0,factor=1.3"),))  # fmt: skip
    with live_service(settings) as url, httpx.Client(base_url=url, timeout=30) as http:
        for h, host in enumerate(layout.hosts):
            gpus = [{"index": g, "uuid": f"GPU-{h:04d}-{g:04d}"} for g in range(4)]
            r = http.put(f"/v1/fleet/hosts/{host}/hardware",
                         json={"gpus": gpus, "nics": [{"name": "mlx5_0"}]})  # fmt: skip
            assert r.status_code == 200, r.text
        for env in scenario.envelopes(scenario.simulation()):
            r = http.post("/v1/ingest", content=encode_envelope(env, compress=False),
                          headers={"Content-Type": "application/json"})  # fmt: skip
            assert r.status_code == 200, r.text
        assert http.post("/v1/jobs/cli-fleet/flush").status_code == 200
        assert http.post("/v1/fleet/flush").status_code == 200

        gpus = cli(capsys, url, "get", "gpus", "--sort", "score")
        assert len(gpus) == 16 and all(g["jobs"] == 1 for g in gpus)
        slow = gpus[0]  # least healthy first: rank 5 is host 1's GPU 1
        assert slow["part"] == "GPU-0001-0001" and slow["slowness"] > 1.05, gpus[:3]
        one = cli(capsys, url, "describe", "gpu", slow["part"])
        assert one["readings"][0]["job"] == "cli-fleet" and one["readings"][0]["ratio"] > 1.2
        text = cli(capsys, url, "describe", "gpu", slow["part"], out="table")
        assert "Readings (per job or link check):" in text and "cli-fleet" in text

        host = layout.hosts[0]
        drained = cli(capsys, url, "drain", "host", host, "--reason", "ECC errors")
        assert drained[0]["state"] == "failed"
        assert [h["part"] for h in cli(capsys, url, "get", "hosts", "--state", "failed")] == [host]
        back = cli(capsys, url, "return", "host", host, "--reason", "DIMM replaced")
        assert back[0]["state"] == "probation"
        table = cli(capsys, url, "get", "hosts", out="table")
        assert table.splitlines()[0].split()[:3] == ["PART", "HOST", "STATE"]
        assert "probation" in table
        verbs = [(e["verb"], e["target"]) for e in cli(capsys, url, "get", "audit")]
        assert ("drain", host) in verbs and ("return", host) in verbs
        # a wrong state is the service's 409, said plainly
        with pytest.raises(SystemExit, match="return needs one of failed, suspect .HTTP 409"):
            main(["return", "host", layout.hosts[1], "--reason", "x", "--url", url])
