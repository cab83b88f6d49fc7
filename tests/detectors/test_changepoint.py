"""The online change-point detector: sensitivity, dating, robustness, and BOCPD itself."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from failslow.detectors.changepoint import (
    BOCPD,
    OnlineChangeDetector,
    find_change_points,
    hampel,
    segment_window,
)


def steps(
    rng: np.random.Generator, n: int, *, shift_at: int | None = None, factor: float = 1.1
) -> np.ndarray:
    x = 0.42 * np.exp(rng.normal(0, 0.02, n))
    if shift_at is not None:
        x[shift_at:] *= factor
    x[50::50] += 1.0  # checkpoint stalls
    spikes = rng.random(n) < 0.01
    x[spikes] *= rng.uniform(2, 5, spikes.sum())
    return x


def test_constant_and_healthy_noisy_streams_raise_nothing() -> None:
    assert find_change_points(np.full(500, 3.0)) == []
    rng = np.random.default_rng(7)
    assert all(find_change_points(steps(rng, 2000)) == [] for _ in range(3))


@pytest.mark.parametrize("factor", [1.1, 1.2, 1.5])
def test_step_change_is_found_dated_and_confirmed_quickly(factor: float) -> None:
    rng = np.random.default_rng(3)
    x = steps(rng, 800, shift_at=400, factor=factor)
    det = OnlineChangeDetector()
    confirmed_at = None
    for t, v in enumerate(x):
        if any(abs(p.index - 400) <= 1 for p in det.update(v)) and confirmed_at is None:
            confirmed_at = t
    assert [c for c in det.change_points if abs(c - 400) <= 1]  # dated to +-1 sample
    assert confirmed_at is not None and confirmed_at - 400 <= 10
    assert all(abs(c - 400) <= 1 for c in det.change_points)


def test_drift_and_random_walk_are_not_cut_into_steps() -> None:
    t = np.arange(400, dtype=float)
    assert find_change_points(100 + 0.5 * t + np.random.default_rng(1).normal(0, 1, 400)) == []
    walk = np.cumsum(np.random.default_rng(2).normal(0, 1, 600))
    assert len(find_change_points(walk)) <= 2


def test_seeded_series_pins_exact_indices() -> None:
    rng = np.random.default_rng(11)
    x = np.concatenate([rng.normal(0, 1, 150), rng.normal(4, 1, 150), rng.normal(1, 1, 150)])
    assert find_change_points(x) == [150, 300]


def test_hampel_removes_spikes_not_shifts() -> None:
    x = np.r_[np.zeros(20), np.ones(20)] + np.random.default_rng(0).normal(0, 0.01, 40)
    x[5] = 10.0
    y = hampel(x)
    assert abs(y[5]) < 0.1 and np.allclose(y[20:], x[20:], atol=0.05)
    assert segment_window(x, min_size=5, penalty=3.0) == [20]


def test_bocpd_run_length_tracks_a_change_per_series() -> None:
    b = BOCPD(3, hazard=1 / 50, max_run=64)
    rng = np.random.default_rng(5)
    for t in range(120):
        x = rng.normal(0, 1, 3)
        if t >= 80:
            x[1] += 8  # only series 1 changes
        b.update(x)
    runs = b.map_run()
    assert runs[1] < 45 and runs[0] > 60 and runs[2] > 60
    assert b.recent_change_probability(5)[1] < 0.5  # the change is 40 samples old, not recent


def test_bocpd_ignores_nan_for_that_series_only() -> None:
    b = BOCPD(2)
    for _ in range(10):
        b.update(np.array([1.0, np.nan]))
    assert b.count.tolist() == [10, 0]


@settings(max_examples=30, deadline=None)
@given(st.floats(0.1, 1e6), st.integers(0, 10_000))
def test_scale_invariance(scale: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.normal(0, 1, 100), rng.normal(5, 1, 100)])
    assert find_change_points(x) == find_change_points(x * scale)
