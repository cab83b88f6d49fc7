"""Without a bus, a restart resumes detection where it was (issue 17): detector windows and the
baseline come back from the job's snapshot, so a slowdown under way is not learned as normal."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from failslow.harness.simulator import Fault, Layout, Scenario
from failslow.service.app import create_app
from failslow.service.settings import Settings
from failslow.service.stream.settings import StateSettings

JOB = "resume"


def scenario() -> Scenario:
    # a GPU 1.6x slower from step 40 to the end
    return Scenario(
        job=JOB, layout=Layout(tp=2, pp=2, dp=2, gpus_per_host=2), steps=100, seed=11,
        faults=(Fault("slow_gpu", 40, 200, factor=1.6, ranks=(5,)),),
    )  # fmt: skip


def settings(db: Path, every_s: float) -> Settings:
    return Settings(
        database_url=f"sqlite:///{db}", lease_ttl_s=0, state=StateSettings(snapshot_every_s=every_s)
    )


def feed(client: TestClient, envelopes: list[dict]) -> None:  # type: ignore[type-arg]
    for env in envelopes:
        assert client.post("/v1/ingest", json=env).status_code == 200


def detector(client: TestClient) -> dict:  # type: ignore[type-arg]
    return client.get(f"/v1/jobs/{JOB}").json()  # type: ignore[no-any-return]


def slow_gpu(client: TestClient) -> list[dict]:  # type: ignore[type-arg]
    return [i for i in client.get(f"/v1/jobs/{JOB}/incidents").json() if i["kind"] == "slow_gpu"]


def wake(client: TestClient, last: dict) -> None:  # type: ignore[type-arg]
    """A heartbeat: a restarted service loads the job when it next hears of it."""
    beat = {"job": JOB, "host": last["host"], "sent_ns": last["sent_ns"]}
    assert client.post("/v1/ingest", json=beat).status_code == 200


@pytest.mark.parametrize("how", ["clean", "crash"])
def test_a_restart_keeps_detector_state(tmp_path: Path, how: str) -> None:
    sc = scenario()
    envelopes = list(sc.envelopes(sc.simulation()))
    half = len(envelopes) * 6 // 10  # step ~60: the slow GPU's incident is open
    db = tmp_path / "f.db"
    first = TestClient(create_app(settings(db, every_s=0.2)))
    with first:
        feed(first, envelopes[:half])
        first.post(f"/v1/jobs/{JOB}/flush")
        before = detector(first)
        [inc] = slow_gpu(first)
        assert inc["kind"] == "slow_gpu" and inc["state"] == "open"
        if how == "crash":  # a second service while the first still runs: nothing at shutdown
            time.sleep(0.6)  # a periodic snapshot has been written meanwhile
            second = TestClient(create_app(settings(db, every_s=0.2)))
            second.__enter__()
    if how == "clean":
        second = TestClient(create_app(settings(db, every_s=0.2)))
        second.__enter__()
    try:
        wake(second, envelopes[half - 1])
        after = detector(second)  # loading the job restored its detector state
        assert after["baseline_step_time_s"] == before["baseline_step_time_s"]
        assert after["detector"]["frames_analysed"] == before["detector"]["frames_analysed"]
        feed(second, envelopes[half:])
        second.post(f"/v1/jobs/{JOB}/flush")
        end = detector(second)
        assert end["detector"]["frames_analysed"] > before["detector"]["frames_analysed"]
        assert end["baseline_step_time_s"] == pytest.approx(before["baseline_step_time_s"])
        incidents = slow_gpu(second)
        assert [i["id"] for i in incidents] == [inc["id"]]  # the same incident, still open
        assert incidents[0]["state"] == "open" and incidents[0]["onset_step"] == inc["onset_step"]
    finally:
        second.__exit__(None, None, None)


def test_without_snapshots_detection_starts_afresh(tmp_path: Path) -> None:
    """What the snapshots change (and what this test guards): with them off, a restart forgets
    the detectors' windows."""
    sc = scenario()
    envelopes = list(sc.envelopes(sc.simulation()))
    db = tmp_path / "f.db"
    half = len(envelopes) // 2
    with TestClient(create_app(settings(db, every_s=0))) as c:
        feed(c, envelopes[:half])
        c.post(f"/v1/jobs/{JOB}/flush")
        assert detector(c)["detector"]["frames_analysed"] > 0
    with TestClient(create_app(settings(db, every_s=0))) as c:
        wake(c, envelopes[half - 1])
        assert detector(c)["detector"]["frames_analysed"] == 0
