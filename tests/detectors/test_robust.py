import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from failslow.detectors.robust import (
    group_median,
    loo_median,
    median_mad,
    nanmedian_rows,
    quiet_nan,
)


def brute(x: np.ndarray) -> np.ndarray:
    out = np.full(x.shape, np.nan)
    for r in range(x.shape[0]):
        for j in range(x.shape[1]):
            if not np.isfinite(x[r, j]):
                continue
            others = np.delete(x[r], j)
            others = others[np.isfinite(others)]
            if others.size:
                out[r, j] = np.median(others)
    return out


@settings(max_examples=500, deadline=None)
@given(
    arrays(
        np.float64,
        st.tuples(st.integers(1, 4), st.integers(1, 9)),
        elements=st.one_of(
            st.floats(-1e6, 1e6, allow_nan=False),
            st.sampled_from([0.0, 1.0, 2.0]),  # ties
            st.just(np.nan),
        ),
    )
)
def test_loo_median_matches_brute_force_exactly(x: np.ndarray) -> None:
    np.testing.assert_array_equal(loo_median(x), brute(x))


def test_loo_median_pair_compares_with_the_other_member() -> None:
    got = loo_median(np.array([[1.0, 3.0]]))
    assert got.tolist() == [[3.0, 1.0]]


def test_loo_median_rejects_1d() -> None:
    with pytest.raises(ValueError):
        loo_median(np.array([1.0, 2.0]))


def test_median_mad() -> None:
    med, mad = median_mad(np.array([1.0, 2.0, 3.0, 100.0, np.nan]))
    assert med == 2.5
    assert mad == pytest.approx(1.4826 * 1.0)
    assert all(np.isnan(median_mad(np.array([np.nan]))))


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 6),  # groups
    st.integers(1, 5),  # members per group when equal
    st.booleans(),  # equal groups (the fast path) or ragged ones
    st.integers(0, 2**32 - 1),
)
def test_group_median_matches_numpy_per_group(
    groups: int, size: int, equal: bool, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    g = np.repeat(np.arange(groups), size) if equal else rng.integers(-1, groups, groups * size)
    rng.shuffle(g)
    v = rng.integers(0, 4, g.size).astype(float)  # ties
    if not equal:
        v[rng.random(g.size) < 0.1] = np.nan  # missing values
    got = group_median(v, g, groups + 1)
    for k in range(groups + 1):
        sel = (g == k) & np.isfinite(v)
        want = np.median(v[sel]) if sel.any() else np.nan
        np.testing.assert_array_equal(got[k], want)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 8), st.integers(1, 12), st.booleans(), st.integers(0, 2**32 - 1))
def test_nanmedian_rows_matches_numpy(rows: int, m: int, single: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 4, (rows, m)).astype(np.float32 if single else np.float64) * 0.37
    x[rng.random(x.shape) < 0.3] = np.nan
    want = np.array(
        [np.median(r[~np.isnan(r)]) if (~np.isnan(r)).any() else np.nan for r in x.astype(float)]
    )
    np.testing.assert_array_equal(nanmedian_rows(x), want)
    count = np.count_nonzero(~np.isnan(x), axis=1)
    np.testing.assert_array_equal(nanmedian_rows(x, count), want)


@settings(max_examples=200, deadline=None)
@given(
    arrays(
        st.sampled_from([np.float64, np.float32]),
        st.tuples(st.integers(1, 5), st.integers(1, 5)),
        elements=st.sampled_from([np.nan, -1.0, 0.0, 0.5, 2.0, 7.0]),
    ),
    st.sampled_from([None, 0, 1]),
    st.sampled_from([np.nanmedian, np.nanmean, np.nanmin, np.nanmax]),
)
def test_quiet_nan_equals_numpy_without_warning(x: np.ndarray, axis: int | None, fn) -> None:  # type: ignore[no-untyped-def]
    with warnings.catch_warnings():  # the test's own thread: numpy's warning is expected here
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = fn(x, axis=axis)
    got = quiet_nan(fn, x, axis)  # pytest turns any warning into an error
    assert np.shape(got) == np.shape(expected)
    assert np.asarray(got).dtype == np.asarray(expected).dtype
    assert np.array_equal(np.asarray(got), np.asarray(expected), equal_nan=True)
