"""Vectorised robust statistics over rows of a 2-D array (NaN = missing)."""

from __future__ import annotations

import numpy as np

MAD_SCALE = 1.4826  # MAD of a normal distribution -> its standard deviation


def loo_median(values: np.ndarray) -> np.ndarray:
    """For each element, the median of the *other* valid elements of its row (NaN if none).

    ``values`` has shape (rows, m). NaNs are missing and neither counted nor given a result.
    Leave-one-out matters for small groups: in a pair the straggler must be compared with its
    peer alone, not with a median that half contains itself.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError("loo_median expects a 2-D array")
    rows, m = x.shape
    if m == 0:
        return x.copy()
    order = np.argsort(x, axis=1, kind="stable")  # NaNs sort last
    s = np.take_along_axis(x, order, axis=1)
    valid = np.isfinite(x)
    k = valid.sum(axis=1, keepdims=True)  # valid per row
    pos = np.arange(m)[None, :]  # sorted position of each element
    rem = k - 1
    lo = (rem - 1) // 2
    hi = rem // 2
    lo_idx = np.clip(lo + (lo >= pos), 0, m - 1)
    hi_idx = np.clip(hi + (hi >= pos), 0, m - 1)
    med_sorted = 0.5 * (
        np.take_along_axis(s, lo_idx, axis=1) + np.take_along_axis(s, hi_idx, axis=1)
    )
    med_sorted = np.where((rem >= 1) & (pos < k), med_sorted, np.nan)
    out = np.empty_like(med_sorted)
    np.put_along_axis(out, order, med_sorted, axis=1)
    return out


def median_mad(values: np.ndarray) -> tuple[float, float]:
    """Median and scaled MAD of the finite values (NaN, NaN when there are none)."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return float("nan"), float("nan")
    med = float(np.median(v))
    return med, MAD_SCALE * float(np.median(np.abs(v - med)))


def group_median(values: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    """Median of the finite ``values`` of each group (``groups`` in [0, n_groups)), vectorised."""
    v = np.asarray(values, dtype=np.float64)
    g = np.asarray(groups, dtype=np.int64)
    ok = np.isfinite(v) & (g >= 0)
    v, g = v[ok], g[ok]
    out = np.full(n_groups, np.nan)
    if v.size == 0:
        return out
    order = np.lexsort((v, g))
    v, g = v[order], g[order]
    counts = np.bincount(g, minlength=n_groups)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    has = counts > 0
    lo = starts[has] + (counts[has] - 1) // 2
    hi = starts[has] + counts[has] // 2
    out[has] = 0.5 * (v[lo] + v[hi])
    return out
