"""Detection work per pass is bounded per job (issue 31, case 5): 12,000 step records of a
one-rank job in one 95 KiB envelope were 12,000 frames in one pass, 16-20 s of CPU during
which no other job was analysed. Now one pass analyses at most ``max_frames_per_pass`` frames
of a job; the rest wait for the next passes, every job gets its turn in each, and nothing is
skipped below ``max_backlog_rank_frames``."""

from __future__ import annotations

from fastapi.testclient import TestClient

from failslow.service.app import create_app
from failslow.service.settings import Settings
from tests.helpers import MS, T0, envelope, step


def _job(c: TestClient, job: str, steps: int) -> None:
    env = envelope(job=job, sent_ns=T0 + (steps + 10) * 100 * MS,
                   ranks=[{"rank": 0, "gpu": 0, "world_size": 1}],
                   steps=[step(0, i, T0 + i * 100 * MS, T0 + (i + 1) * 100 * MS - MS)
                          for i in range(steps)])  # fmt: skip
    r = c.post("/v1/ingest", json=env)
    assert r.status_code == 200 and r.json()["accepted"] == steps, r.text


def test_a_burst_is_analysed_over_several_passes_and_others_are_not_held_up(
    settings: Settings,
) -> None:
    detection = settings.detection.model_copy(
        update={"interval_s": 3600.0, "max_frames_per_pass": 50}  # passes run by hand here
    )
    with TestClient(create_app(settings.model_copy(update={"detection": detection}))) as c:
        engine = c.app.state.ctx.detection  # type: ignore[attr-defined]
        _job(c, "burst", 1_200)
        _job(c, "calm", 5)
        passes = []
        while (n := engine.run_due()) or not passes:
            passes.append(n)
            # the calm job's frames are analysed in the first pass, beside the burst's first
            assert len(engine.frame_times("calm", since_step=None, last=100)) >= 4
        backlog = engine._runtimes["burst"].backlog
        skipped = c.get("/metrics").text
    assert max(passes) <= 50 + 5 and len(passes) >= 1_100 // 50, passes
    assert sum(passes) >= 1_190 and backlog == []  # every closed frame analysed, in turns
    assert "failslow_frames_skipped_total 0.0" in skipped


def test_past_the_backlog_bound_the_oldest_frames_are_skipped_and_counted(
    settings: Settings,
) -> None:
    detection = settings.detection.model_copy(
        update={"interval_s": 3600.0, "max_frames_per_pass": 10, "max_backlog_rank_frames": 100}
    )
    with TestClient(create_app(settings.model_copy(update={"detection": detection}))) as c:
        engine = c.app.state.ctx.detection  # type: ignore[attr-defined]
        _job(c, "burst", 300)
        first = engine.run_due()
        backlog = len(engine._runtimes["burst"].backlog)
        metrics = c.get("/metrics").text
    assert first == 10 and backlog == 100
    skipped = next(line for line in metrics.splitlines()
                   if line.startswith("failslow_frames_skipped_total "))  # fmt: skip
    assert float(skipped.split()[1]) >= 150
