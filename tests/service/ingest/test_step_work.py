"""Work per step (issue 16): the SDK says how much work a rank's step had (tokens, samples);
v1 and v2 carry it, the service validates it record by record and puts it into the frames."""

from __future__ import annotations

import math

import numpy as np
import orjson
from fastapi.testclient import TestClient

from failslow.agents import wire
from failslow.service.ingest.envelope import parse_envelope
from failslow.service.settings import StateSettings
from failslow.service.stream.state import JobState
from failslow.wire import v2
from tests.helpers import MS, T0, envelope, step, two_hosts


def test_sdk_messages_carry_work_only_when_given() -> None:
    assert wire.step_dict(["s", 3, 7, 1, 2]) == {"rank": 3, "step": 7, "start_ns": 1, "end_ns": 2}
    assert wire.step_dict(["s", 3, 7, 1, 2, 512.0])["work"] == 512.0


def test_v1_steps_with_work_are_checked_record_by_record(client: TestClient) -> None:
    h0, _ = two_hosts()
    steps = [
        {**step(0, 0, T0, T0 + MS), "work": 4096},
        {**step(1, 0, T0, T0 + MS), "work": 0},  # not positive
        {**step(0, 1, T0 + MS, T0 + 2 * MS), "work": "many"},
        step(1, 1, T0 + MS, T0 + 2 * MS),  # none said: fine
    ]
    body = envelope(**h0, steps=steps, agent="a", batch_seq=0)
    r = client.post("/v1/ingest", content=orjson.dumps(body),
                    headers={"Content-Type": "application/json"})  # fmt: skip
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["accepted"] == 2
    assert [x["index"] for x in out["rejected"]] == ["steps[1]", "steps[2]"]
    assert all("work" in x["reason"] for x in out["rejected"])


def test_v2_work_column_round_trips_and_bad_values_are_rejected(client: TestClient) -> None:
    h0, _ = two_hosts()
    r = client.put("/v2/jobs/j/topology/h0", json={"sent_ns": T0, **h0})
    digest = r.json()["digest"]
    header = {"job": "j", "host": "h0", "sent_ns": T0 + MS, "agent": "a", "batch_seq": 0,
              "topology": digest}  # fmt: skip
    steps = [
        {**step(0, 0, T0, T0 + MS), "work": 300.0},
        {**step(1, 0, T0, T0 + MS), "work": -2.0},
        step(0, 1, T0 + MS, T0 + 2 * MS),  # NaN in the column: not said
    ]
    body = v2.encode_records(header, {}, [], steps)
    head, cols = v2.decode(body)
    assert head["step_work"] is True and cols.steps["work"][0] == 300.0
    assert math.isnan(cols.steps["work"][2])
    r = client.post("/v2/ingest", content=body, headers={"Content-Type": v2.MEDIA_TYPE})
    assert r.status_code == 200, r.text
    assert r.json()["accepted"] == 2
    assert [(x["index"], x["reason"]) for x in r.json()["rejected"]] == [
        ("steps[1]", "work must be a positive number")
    ]
    # without any work the body is exactly the old format (no flag, no column)
    plain = v2.encode_records(header, {}, [], [step(0, 0, T0, T0 + MS)])
    assert b"step_work" not in plain and v2.decode(plain)[1].steps.keys() == {
        "rank", "step", "start_ns", "end_ns"
    }  # fmt: skip


def test_frames_carry_each_ranks_work() -> None:
    h0, h1 = two_hosts()
    state = JobState("job-a", StateSettings())
    for host, ann, works in (("h0", h0, (100.0, 250.0)), ("h1", h1, (100.0, None))):
        ranks = [r["rank"] for r in ann["ranks"]]
        steps = []
        for k in range(3):
            for r, w in zip(ranks, works, strict=True):
                rec = step(r, k, T0 + k * 10 * MS, T0 + (k + 1) * 10 * MS)
                steps.append(rec if w is None else {**rec, "work": w})
        env = envelope(host=host, **ann, steps=steps, agent=host, batch_seq=0,
                       sent_ns=T0 + 40 * MS)  # fmt: skip
        state.apply(parse_envelope(env))
    frames = state.frames.advance(T0 + 10_000 * MS, state.topology.n_slots, flush=True, world=4)
    assert frames
    slot = {r: i for i, r in enumerate(state.topology.slot_rank)}
    got = frames[0].work
    assert got[slot[0]] == 100.0 and got[slot[1]] == 250.0 and got[slot[2]] == 100.0
    assert np.isnan(got[slot[3]])
