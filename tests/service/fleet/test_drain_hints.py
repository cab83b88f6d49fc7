"""Drain hints through the actions' approval rules: a host that hangs a job is failed, a drain
action is proposed for it (manual by default), approved by an operator, carried out by the
actuator — the log one, and a real Slurm cluster's ``scontrol`` (the test Slurm of make test)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from failslow.agents.wire import encode_envelope
from failslow.harness.simulator import Fault, Layout, Scenario
from failslow.harness.simulator.faults import FaultKind
from failslow.service.actions.settings import ActionsSettings
from failslow.service.app import create_app
from failslow.service.fleet import standing
from failslow.service.fleet.settings import FleetSettings
from failslow.service.settings import DetectionSettings, Settings


def hang_job(c: TestClient, job: str, dead: str, other: str) -> None:
    """A 2-host job whose host ``dead`` stops at step 60: a hang names it."""
    layout = Layout(tp=2, pp=1, dp=4, gpus_per_host=4)
    names = dict(zip(layout.hosts, (other, dead), strict=True))
    stop = Fault(FaultKind.DEAD_HOST, 60, hosts=(layout.hosts[1],))
    scenario = Scenario(job=job, layout=layout, steps=100, seed=5, faults=(stop,))
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    for env in scenario.envelopes(scenario.simulation()):
        body = encode_envelope({**env, "host": names[env["host"]]})
        r = c.post("/v1/ingest", content=body, headers=headers)
        assert r.status_code == 200, r.text
    assert c.post(f"/v1/jobs/{job}/flush").status_code == 200
    assert c.post("/v1/fleet/flush").status_code == 200


def app(tmp: Path, actions: ActionsSettings) -> TestClient:
    return TestClient(create_app(Settings(
        database_url=f"sqlite:///{tmp}/hints.db", detection=DetectionSettings(interval_s=0.05),
        fleet=FleetSettings(flush_interval_s=3600), actions=actions,
    )))  # fmt: skip


def drains(c: TestClient, job: str) -> list[dict[str, Any]]:
    return [a for a in c.get(f"/v1/jobs/{job}/actions").json() if a["kind"] == "drain"]


def test_a_failed_host_is_hinted_once_and_drained_after_approval(tmp_path: Path) -> None:
    with app(tmp_path, ActionsSettings()) as c:
        hang_job(c, "hint-1", "gpu-node-9", "gpu-node-2")
        host = c.get("/v1/fleet/hosts/gpu-node-9").json()
        assert host["state"] == "failed", host
        [hint] = drains(c, "hint-1")
        assert hint["state"] == "proposed" and hint["mode"] == "manual"  # approval by default
        assert hint["target"] == "host:gpu-node-9" and "failed hard" in hint["reason"]
        assert c.post("/v1/fleet/flush").status_code == 200
        assert len(drains(c, "hint-1")) == 1  # still failed: not hinted again
        r = c.post(f"/v1/actions/{hint['id']}/approve", json={"reason": "agreed, PSU"})
        assert r.status_code == 200, r.text
        done = c.get(f"/v1/actions/{hint['id']}").json()
        assert done["state"] == "succeeded" and done["actuator"] == "log"
        # an operator drains a healthy host: a hint too, named after the operator's reason
        out = c.post("/v1/fleet/hosts/gpu-node-2/drain", json={"reason": "fan noise"}).json()
        assert out["state"] == "failed" and out["hint"].endswith("(proposed)")
        mine = [a for a in drains(c, "hint-1") if a["target"] == "host:gpu-node-2"]
        assert len(mine) == 1 and "fan noise" in mine[0]["reason"]


def test_a_hint_skipped_while_its_job_was_muted_comes_once_it_is_unmuted(tmp_path: Path) -> None:
    with app(tmp_path, ActionsSettings()) as c:
        assert c.post("/v1/jobs/mute-1/mute", json={"reason": "drill"}).status_code == 200
        hang_job(c, "mute-1", "gpu-node-7", "gpu-node-4")
        assert c.get("/v1/fleet/hosts/gpu-node-7").json()["state"] == "failed"
        assert drains(c, "mute-1") == []  # muted: nothing proposed
        assert c.post("/v1/jobs/mute-1/unmute", json={"reason": "over"}).status_code == 200
        for _ in range(standing.FULL_EVERY):  # the next full judgement offers it again
            assert c.post("/v1/fleet/flush").status_code == 200
        [hint] = drains(c, "mute-1")
        assert hint["state"] == "proposed" and hint["target"] == "host:gpu-node-7"
        for _ in range(standing.FULL_EVERY):  # offered again: the same action, no second one
            assert c.post("/v1/fleet/flush").status_code == 200
        assert [a["id"] for a in drains(c, "mute-1")] == [hint["id"]]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tests.infra import slurm as infra

    why = infra.unavailable()
    if why:
        pytest.skip(why)
    with infra.cluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


def test_the_hint_drains_the_node_in_a_real_slurm_cluster(tmp_path: Path, slurm: Any) -> None:
    actions = ActionsSettings(actuators=["log", "plan", "slurm"], slurm_conf=str(slurm.conf),
                              actuator_for={"drain": "slurm"})  # fmt: skip
    assert "DRAIN" not in slurm.field("node", slurm.node, "State")
    with app(tmp_path, actions) as c:
        hang_job(c, "hint-slurm", slurm.node, "gpu-node-2")
        [hint] = drains(c, "hint-slurm")
        assert hint["state"] == "proposed" and hint["actuator"] == "slurm"
        assert "DRAIN" not in slurm.field("node", slurm.node, "State")  # nothing before approval
        r = c.post(f"/v1/actions/{hint['id']}/approve", json={"reason": "drain it"})
        assert r.status_code == 200, r.text
        done = c.get(f"/v1/actions/{hint['id']}").json()
        assert done["state"] == "succeeded", done
        assert "state=drain" in done["result"]["commands"][0]
    assert "DRAIN" in slurm.field("node", slurm.node, "State")
    reason = slurm.run("scontrol", "show", "node", slurm.node)
    assert f"failslow {hint['id']}" in reason and "fleet" in reason


def test_a_returned_host_is_put_back_in_service_only_when_failslow_drained_it(
    tmp_path: Path, slurm: Any
) -> None:
    """Drained through a hint, returned from repair: the undrain action resumes the node; a node
    an administrator drained meanwhile for something else stays drained."""
    actions = ActionsSettings(actuators=["log", "plan", "slurm"], slurm_conf=str(slurm.conf),
                              actuator_for={"drain": "slurm", "undrain": "slurm"})  # fmt: skip
    with app(tmp_path, actions) as c:
        hang_job(c, "back-slurm", slurm.node, "gpu-node-3")
        [hint] = drains(c, "back-slurm")
        c.post(f"/v1/actions/{hint['id']}/approve", json={"reason": "drain it"})
        assert "DRAIN" in slurm.field("node", slurm.node, "State")
        out = c.post(f"/v1/fleet/hosts/{slurm.node}/return", json={"reason": "PSU replaced"})
        assert out.status_code == 200, out.text
        body = out.json()
        assert body["state"] == "probation" and body["hint"].endswith("(proposed)"), body
        back = body["hint"].split(" ")[0]
        assert "DRAIN" in slurm.field("node", slurm.node, "State")  # nothing before approval
        r = c.post(f"/v1/actions/{back}/approve", json={"reason": "back in service"})
        assert r.status_code == 200, r.text
        done = c.get(f"/v1/actions/{back}").json()
        assert done["state"] == "succeeded" and done["kind"] == "undrain", done
        assert "DRAIN" not in slurm.field("node", slurm.node, "State")
        # drained by hand for something else, then failslow's hint again: left drained
        slurm.run("scontrol", "update", f"nodename={slurm.node}", "state=drain",
                  "reason=rack maintenance")  # fmt: skip
        c.post(f"/v1/fleet/hosts/{slurm.node}/drain", json={"reason": "again"})
        body = c.post(f"/v1/fleet/hosts/{slurm.node}/return", json={"reason": "ok"}).json()
        again = body["hint"].split(" ")[0]
        c.post(f"/v1/actions/{again}/approve", json={"reason": "back"})
        failed = c.get(f"/v1/actions/{again}").json()
        assert failed["state"] == "failed" and "drained by someone else" in str(failed["result"])
        assert "DRAIN" in slurm.field("node", slurm.node, "State")
    slurm.run("scontrol", "update", f"nodename={slurm.node}", "state=resume")
