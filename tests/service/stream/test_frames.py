"""Frames: attribution of collective contributions to steps, closing rules, time mode."""

from __future__ import annotations

import numpy as np
import pytest

from failslow.service.ingest.envelope import parse_envelope
from failslow.service.settings import StateSettings
from failslow.service.stream.state import JobState
from tests.helpers import MS, T0, coll, envelope, step, two_hosts


@pytest.fixture(autouse=True, params=["jit", "numpy"])
def frame_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs with the compiled kernels (where numba is installed) and without."""
    monkeypatch.setenv("FAILSLOW_JIT", "1" if request.param == "jit" else "0")
    return str(request.param)


def apply(state: JobState, env: dict) -> None:  # type: ignore[type-arg]
    result = state.apply(parse_envelope(env))
    assert not result.rejected, result.rejected


def close(state: JobState, *, flush: bool = False):  # type: ignore[no-untyped-def]
    state.drain_ready()
    return state.frames.advance(
        state.watermark_ns, state.topology.n_slots, flush=flush, world=state.topology.world_size
    )


def one_step(k: int, late_rank: int = 3, late_ms: int = 30) -> tuple[dict, dict]:  # type: ignore[type-arg]
    """Step k (100 ms) with one allreduce where ``late_rank`` arrives ``late_ms`` late."""
    base = T0 + k * 100 * MS
    arrive = {r: base + 50 * MS + (late_ms * MS if r == late_rank else 0) for r in range(4)}
    end = base + 50 * MS + late_ms * MS + 2 * MS
    h0, h1 = two_hosts()
    e0 = envelope(
        host="h0",
        sent_ns=base + 100 * MS,
        **h0,
        collectives=[coll(r, k, arrive[r], end) for r in (0, 1)],
        steps=[step(r, k, base, base + 100 * MS) for r in (0, 1)],
    )
    e1 = envelope(
        host="h1",
        sent_ns=base + 100 * MS,
        **h1,
        collectives=[coll(r, k, arrive[r], end) for r in (2, 3)],
        steps=[step(r, k, base, base + 100 * MS) for r in (2, 3)],
    )
    return e0, e1


def test_step_closes_when_every_reporter_reported() -> None:
    state = JobState("j", StateSettings(frame_grace_s=60))
    for k in range(3):
        e0, e1 = one_step(k)
        apply(state, e0)
        assert [f.index for f in close(state)] == ([] if k == 0 else [])  # h1 still missing
        apply(state, e1)
        closed = close(state)
        # the first frame is complete when the whole announced world (4) reported it
        assert [f.index for f in closed] == [k]
    frames = close(state, flush=True)
    assert frames == []


def test_lateness_goes_to_the_late_rank_in_its_own_step() -> None:
    state = JobState("j", StateSettings())
    for k in range(2):
        for e in one_step(k, late_rank=3, late_ms=30):
            apply(state, e)
    frames = close(state, flush=True)
    assert [f.index for f in frames] == [0, 1]
    f = frames[1]
    late = f.late.sum(axis=1)
    assert late[3] == np.float64(0.03)
    assert late[:3].tolist() == [0.0, 0.0, 0.0]
    np.testing.assert_allclose(f.comm_time, [0.032, 0.032, 0.032, 0.002])
    np.testing.assert_allclose(f.step_time, [0.1] * 4)


def test_collectives_arriving_before_their_step_record_wait_for_it() -> None:
    state = JobState("j", StateSettings())
    e0, e1 = one_step(0)
    steps0, steps1 = e0.pop("steps"), e1.pop("steps")
    apply(state, e0)
    apply(state, e1)
    assert close(state) == []
    apply(state, envelope(host="h0", sent_ns=T0 + 100 * MS, steps=steps0))
    apply(state, envelope(host="h1", sent_ns=T0 + 100 * MS, steps=steps1))
    frames = close(state, flush=True)
    assert frames[0].collectives == 4 and state.frames.dropped_contributions == 0


def test_grace_closes_a_step_with_a_missing_rank() -> None:
    state = JobState("j", StateSettings(frame_grace_s=1.0))
    e0, e1 = one_step(0)
    apply(state, e0)
    apply(state, e1)
    e0, _ = one_step(1)
    apply(state, e0)
    assert [f.index for f in close(state)] == [0]  # step 1: h1 has not reported it
    apply(state, envelope(host="h0", sent_ns=T0 + 5_000 * MS))  # heartbeat: event time moves on
    frames = close(state)
    assert [f.index for f in frames] == [1]
    assert np.isnan(frames[0].step_time[2:]).all()  # h1's ranks: missing, not slow


def test_time_frames_when_no_steps_are_sent() -> None:
    state = JobState("j", StateSettings(time_frame_s=1.0, frame_grace_s=0.5))
    for k in range(30):  # 3 s of 100 ms "steps" without step records
        for e in one_step(k):
            e.pop("steps")
            apply(state, e)
    frames = close(state)
    assert state.frames.time_mode and not state.frames.has_steps
    assert [f.index for f in frames][:1] == [(T0 + 50 * MS) // 10**9]
    assert all(not f.has_steps for f in frames)
    assert frames[0].late.sum(axis=1)[3] > 0.2  # ~10 collectives x 30 ms


def test_many_steps_between_detection_passes_lose_nothing() -> None:
    """Regression: 40 steps ingested before any pass (more than the 16-step ring) all count."""
    state = JobState("j", StateSettings())
    for k in range(40):
        for e in one_step(k, late_rank=3, late_ms=30):
            apply(state, e)
    frames = close(state, flush=True)
    assert [f.index for f in frames] == list(range(40))
    assert state.frames.dropped_contributions == 0
    assert all(f.late.sum(axis=1)[3] == np.float64(0.03) for f in frames)


def test_one_envelope_holding_more_steps_than_the_ring() -> None:
    state = JobState("j", StateSettings())
    e0s, e1s = zip(*(one_step(k) for k in range(40)), strict=True)
    for batch in (e1s, e0s):  # each host sends all 40 steps in one envelope
        merged = dict(batch[0])
        merged["collectives"] = [c for e in batch for c in e["collectives"]]
        merged["steps"] = [s for e in batch for s in e["steps"]]
        apply(state, merged)
    frames = close(state, flush=True)
    assert len(frames) == 40 and state.frames.dropped_contributions == 0


def test_ranks_without_step_records_use_the_job_interval() -> None:
    state = JobState("j", StateSettings())
    for k in range(3):
        e0, e1 = one_step(k, late_rank=3)
        e0["steps"] = [s for s in e0["steps"] if s["rank"] == 0]  # only rank 0 reports steps
        e1["steps"] = []
        apply(state, e0)
        apply(state, e1)
    frames = close(state, flush=True)
    assert [f.index for f in frames] == [0, 1, 2]
    assert state.frames.dropped_contributions == 0
    assert frames[1].late.sum(axis=1)[3] == np.float64(0.03)  # rank 3's lateness still counted
    assert np.isnan(frames[1].step_time[1:]).all()


def test_limits_grow_with_the_ranks_shown_not_the_world_declared() -> None:
    from failslow.service.stream.settings import Limits

    s = StateSettings(max_comms=10, comms_per_rank=2, max_comm_members=100, members_per_rank=8)
    assert Limits.of(s, None).comms == 10 and Limits.of(s, 1000).comms == 2000
    state = JobState("j", s)
    comms = [{"comm": f"c{i}", "kind": "tp", "ranks": [0, 1]} for i in range(12)]
    ranks = [{"rank": 0, "gpu": 0}, {"rank": 1, "gpu": 1}]
    small = state.apply(parse_envelope(envelope(ranks=ranks, comms=comms)))
    assert [r["index"] for r in small.rejected] == ["comms[10]", "comms[11]"]  # the floor: 10
    big = [{"rank": 0, "gpu": 0, "world_size": 64}, {"rank": 1, "gpu": 1, "world_size": 64}]
    declared = state.apply(parse_envelope(envelope(ranks=big, comms=comms, sent_ns=T0 + MS)))
    assert [r["index"] for r in declared.rejected] == ["comms[10]", "comms[11]"]  # 2 ranks shown
    shown = [{"rank": r, "gpu": r % 8, "world_size": 64} for r in range(64)]
    grown = state.apply(parse_envelope(envelope(ranks=shown, comms=comms, sent_ns=T0 + 2 * MS)))
    assert grown.rejected == [] and len(state.topology.comms) == 12  # 2 x 64 now
    huge = {"comm": "all", "kind": "world", "ranks": list(range(600))}  # > 8 x 64 members
    r = state.apply(parse_envelope(envelope(comms=[huge], sent_ns=T0 + 3 * MS)))
    assert "communicator members" in r.rejected[0]["reason"]
