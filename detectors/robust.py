"""Vectorised robust statistics over rows of a 2-D array (NaN = missing)."""

from __future__ import annotations

import numpy as np

MAD_SCALE = 1.4826  # MAD of a normal distribution -> its standard deviation


def loo_median(values: np.ndarray) -> np.ndarray:
    """For each element, the median of the *other* valid elements of its row (NaN if none).

    ``values`` has shape (rows, m). NaNs are missing and neither counted nor given a result.
    Leave-one-out matters for small groups: in a pair the straggler must be compared with its
    peer alone, not with a median that half contains itself.

    Removing any copy of a value leaves the same multiset, so the result depends on the value
    alone: with the row sorted (``s``, ``k`` valid values), the other values' median is
    ``(r[lo] + r[hi]) / 2`` with ``lo, hi = (k - 2) // 2, (k - 1) // 2`` and ``r[i] = s[i]`` when
    the value is at least ``s[i + 1]`` (it sits after ``i``), else ``s[i + 1]``. One sort per row
    and a few element-wise passes; no scatter back to the original order.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError("loo_median expects a 2-D array")
    rows, m = x.shape
    if m == 0:
        return x.copy()
    valid = np.isfinite(x)
    all_valid = bool(valid.all())
    s = np.sort(x if all_valid else np.where(valid, x, np.nan), axis=1)  # NaNs last
    k = np.full((rows, 1), m) if all_valid else valid.sum(axis=1, keepdims=True)
    lo = np.clip((k - 2) // 2, 0, m - 1)
    hi = np.clip((k - 1) // 2, 0, m - 1)
    lo1 = np.minimum(lo + 1, m - 1)
    hi1 = np.minimum(hi + 1, m - 1)
    s_lo, s_lo1 = np.take_along_axis(s, lo, axis=1), np.take_along_axis(s, lo1, axis=1)
    s_hi, s_hi1 = np.take_along_axis(s, hi, axis=1), np.take_along_axis(s, hi1, axis=1)
    out = np.where(x >= s_lo1, s_lo, s_lo1)
    out += np.where(x >= s_hi1, s_hi, s_hi1)
    out *= 0.5
    if all_valid:
        if m < 2:
            out[:] = np.nan
        return out
    return np.where(valid & (k >= 2), out, np.nan)


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
