"""The compiled frame-builder kernels compute what the numpy path computes."""

from __future__ import annotations

import numpy as np
import pytest

from bench.detection_scale import NS, add_steps, build, layouts, one_step
from failslow.detectors.lateness import collective_stats
from failslow.service.stream import kernels
from failslow.service.stream.frames import FrameBuilder

pytestmark = pytest.mark.skipif(not kernels.AVAILABLE, reason="numba is not installed")


@pytest.mark.parametrize("m", [1, 2, 3, 4, 7, 8, 9, 16, 31, 32])
def test_lateness_rows_equals_collective_stats(m: int) -> None:
    rng = np.random.default_rng(m)
    starts = rng.integers(0, 1_000_000, (300, m))
    # few distinct durations: ties everywhere
    ends = starts + rng.integers(0, 4, (300, m)) * 250_000
    dur, late, fastest = np.empty((300, m)), np.empty((300, m)), np.empty(300)
    kernels.lateness_rows(starts, ends, dur, late, fastest)
    ref_dur = (ends - starts) * 1e-9
    ref_late, ref_fastest = collective_stats(ref_dur)
    np.testing.assert_array_equal(dur, ref_dur)
    np.testing.assert_array_equal(late, ref_late)
    np.testing.assert_array_equal(fastest, ref_fastest)


def run(jit: bool, n: int = 512) -> tuple[list, FrameBuilder]:  # type: ignore[type-arg]
    """A TP x PP x DP job fed awkwardly: odd steps' collectives come before their step records
    (they wait in the queue), even steps' after (placed at once); two frames are open at once,
    and every third step also brings collectives of a step already closed (dropped)."""
    state, groups = build(n)
    state.assembly.frames = FrameBuilder(
        grace_ns=10 * int(NS), time_frame_ns=int(NS), max_open_frames=8, jit=jit
    )
    rng = np.random.default_rng(7)
    lay = layouts(state, groups, slow=n // 3)
    frames = []
    for step in range(9):
        if step % 3 == 2:
            state.frames.add_collectives(one_step(lay, step - 2, rng), state.topology)
        if step % 2 == 0:
            add_steps(state, step)
        state.frames.add_collectives(one_step(lay, step, rng), state.topology)
        if step % 2:
            add_steps(state, step)
        if step % 2:
            frames += state.frames.advance((step + 1) * int(NS) + 1, n, world=n)
            continue
        state.frames.attribute(n)
    frames += state.frames.advance(10 * int(NS), n, flush=True, world=n)
    return frames, state.frames


def test_compiled_and_numpy_frames_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    placed = []
    place_rows = kernels.place_rows

    def counting(*args):  # type: ignore[no-untyped-def]  # noqa: ANN002, ANN202
        placed.append(place_rows(*args))
        return placed[-1]

    monkeypatch.setattr(kernels, "place_rows", counting)
    fast, fb_fast = run(True)
    assert sum(placed) > 0.4 * sum(f.collectives for f in fast)  # the kernel did place them
    slow, fb_slow = run(False)
    assert [f.index for f in fast] == [f.index for f in slow] == list(range(9))
    for a, b in zip(fast, slow, strict=True):
        assert a.collectives == b.collectives > 0
        for name in ("comm_time", "late", "calls", "comm_transfer", "comm_bytes", "comm_calls"):
            np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=1e-12, atol=0)
        np.testing.assert_array_equal(a.step_time, b.step_time)
    assert fb_fast.dropped_contributions == fb_slow.dropped_contributions > 0
    assert fb_fast.jit and not fb_slow.jit
