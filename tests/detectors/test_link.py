"""The link detector's per-communicator noise gate (median/MAD of its own log bandwidth)."""

from __future__ import annotations

import warnings

import numpy as np

from failslow.detectors.link import LinkDetector


def reference_z(frames: np.ndarray, det: LinkDetector) -> np.ndarray:
    """The gate written plainly: per comm, median and scaled MAD of its window (the last
    ``noise_frames`` values, outliers not stored), computed when it first has
    ``min_noise_frames`` values and refreshed whenever ``(comm + frame) % refresh_frames == 0``
    or its window has grown by a tenth since."""
    n_frames, n = frames.shape
    window: list[list[float]] = [[] for _ in range(n)]
    med = np.full(n, np.nan)
    spread = np.full(n, np.nan)
    size_at = np.zeros(n)
    out = np.full((n_frames, n), np.nan)
    for t in range(n_frames):
        x = np.log(frames[t])
        for c in range(n):
            vals = np.array(window[c][-det.noise_frames :], dtype=np.float32).astype(np.float64)
            vals = vals[np.isfinite(vals)]
            if vals.size < det.min_noise_frames:
                continue
            grown = 10 * vals.size >= 11 * size_at[c]
            if np.isnan(med[c]) or (c + t) % det.refresh_frames == 0 or grown:
                size_at[c] = vals.size
                med[c] = np.median(vals)
                mad = np.median(np.abs(vals - med[c]))
                spread[c] = max(1.4826 * mad, det.min_log_spread)
            out[t, c] = (med[c] - x[c]) / spread[c]
            if out[t, c] >= det.z:
                window[c].append(np.nan)  # an outlier is not learnt
                continue
        for c in range(n):
            if not (np.isfinite(out[t, c]) and out[t, c] >= det.z):
                window[c].append(float(np.float32(x[c])))
    return out


def test_noise_gate_matches_its_plain_definition() -> None:
    rng = np.random.default_rng(3)
    n, n_frames = 7, 330
    # per comm its own level and noise; comm 2 drops 40% for good at frame 150, comm 5 has a
    # few one-frame dips
    level = rng.uniform(1e9, 5e9, n)
    frames = level * np.exp(rng.normal(0, rng.uniform(0.01, 0.2, n), (n_frames, n)))
    frames[150:, 2] *= 0.6
    frames[[60, 61, 200], 5] *= 0.3
    det = LinkDetector()
    got = np.array([det._noise_z(frames[t], np.full(n, -1)) for t in range(n_frames)])
    want = reference_z(frames, det)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = np.isfinite(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=1e-4, atol=1e-4)
    # not judged before min_noise_frames values; the lasting drop stays beyond the noise
    assert np.isnan(got[: det.min_noise_frames]).all()
    assert (got[150:, 2] >= det.z).all()
    assert (got[[60, 61, 200], 5] >= det.z).all()


def test_block_medians_and_baseline_equal_numpy() -> None:
    """The blocks (per-comm medians of 10 frames) and the baseline (their maximum, NaN where no
    block has a finite value) are numpy's nanmedian and nanmax, NaN and inf included."""
    rng = np.random.default_rng(5)
    det = LinkDetector(block=10, history_blocks=5)
    frames = []
    for t in range(80):
        n = 6 + t // 20  # comms appear over time
        x = rng.integers(1, 6, n) * 1e9
        x[rng.random(n) < 0.3] = np.nan
        if t % 9 == 0:
            x[rng.integers(0, n)] = np.inf
        frames.append(x)
        det.learn(x)
    blocks = []
    for b in range(8):
        chunk = frames[10 * b : 10 * b + 10]
        m = np.full((10, max(a.size for a in chunk)), np.nan)
        for i, a in enumerate(chunk):
            m[i, : a.size] = a
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            blocks.append(np.nanmedian(m, axis=0))
    for got, want in zip(det._blocks, blocks[-5:], strict=True):
        np.testing.assert_array_equal(got, want)
    stacked = np.full((5, 10), np.nan)
    for i, b in enumerate(blocks[-5:]):
        stacked[i, : b.size] = b
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want = np.where(np.isfinite(stacked).any(axis=0), np.nanmax(stacked, axis=0), np.nan)
    np.testing.assert_array_equal(det.baseline(10), want)


def test_a_slow_link_must_cost_the_job_time() -> None:
    """Issue 16: two 1 ms eager sends twice as slow (CPU jitter) lose ~0.7% of a 300 ms step: not
    a fail-slow; an all-reduce 100x slower loses most of it."""
    from failslow.detectors.types import KINDS, Frame

    n = 2
    f = Frame(
        0, True, 0, int(3e8), np.full(n, 0.3), np.zeros(n), np.zeros((n, len(KINDS))),
        np.zeros((n, len(KINDS))), 2,
        comm_transfer=np.array([0.004, 0.6]), comm_bytes=np.array([1e6, 1e7]),
        comm_calls=np.array([2.0, 2.0]),
    )  # fmt: skip
    cost = LinkDetector.cost(f, np.array([0.5, 0.01]), 2)
    np.testing.assert_allclose(cost, [0.004 * 0.5 / 0.3, 0.6 * 0.99 / 0.3])
    assert (cost >= LinkDetector().min_cost).tolist() == [False, True]
