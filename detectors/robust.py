"""Vectorised robust statistics over rows of a 2-D array (NaN = missing)."""

from __future__ import annotations

from typing import Any

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
    m = x.shape[1]
    if m == 0:
        return x.copy()
    valid = np.isfinite(x)
    if valid.all():
        return _loo_median_sorted(x, np.sort(x, axis=1))
    s = np.sort(np.where(valid, x, np.nan), axis=1)  # NaNs last
    k = valid.sum(axis=1, keepdims=True)
    lo = np.clip((k - 2) // 2, 0, m - 1)
    hi = np.clip((k - 1) // 2, 0, m - 1)
    lo1 = np.minimum(lo + 1, m - 1)
    hi1 = np.minimum(hi + 1, m - 1)
    s_lo, s_lo1 = np.take_along_axis(s, lo, axis=1), np.take_along_axis(s, lo1, axis=1)
    s_hi, s_hi1 = np.take_along_axis(s, hi, axis=1), np.take_along_axis(s, hi1, axis=1)
    out = np.where(x >= s_lo1, s_lo, s_lo1)
    out += np.where(x >= s_hi1, s_hi, s_hi1)
    out *= 0.5
    return np.where(valid & (k >= 2), out, np.nan)


def _loo_median_sorted(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    """:func:`loo_median` of a row-wise finite ``x`` whose rows, sorted, are ``s``: the same
    order statistics at fixed columns, so plain slices (and one pass when they coincide)."""
    m = x.shape[1]
    if m < 2:
        return np.full(x.shape, np.nan)
    lo, hi = (m - 2) // 2, (m - 1) // 2
    out = np.where(x >= s[:, lo + 1 : lo + 2], s[:, lo : lo + 1], s[:, lo + 1 : lo + 2])
    if lo == hi:  # even m: (a + a) * 0.5 == a exactly
        return out
    out += np.where(x >= s[:, hi + 1 : hi + 2], s[:, hi : hi + 1], s[:, hi + 1 : hi + 2])
    out *= 0.5
    return out


def nanmedian_rows(x: np.ndarray, count: np.ndarray | None = None) -> np.ndarray:
    """``np.nanmedian(x, axis=1)`` from one sort per row (NaNs sort last), in float64 whatever
    ``x``'s float type; NaN for rows without values, no warning. ``count``: the non-NaN values
    of each row, when the caller already keeps them."""
    rows, m = x.shape
    if m == 0:
        return np.full(rows, np.nan)
    c = np.count_nonzero(~np.isnan(x), axis=1) if count is None else count
    s = np.sort(x, axis=1)
    at = np.arange(rows)
    lo, hi = np.maximum(c - 1, 0) // 2, c // 2
    with np.errstate(invalid="ignore"):
        mid = s[at, lo].astype(np.float64) + s[at, np.minimum(hi, m - 1)]
        return np.where(c > 0, 0.5 * mid, np.nan)


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
    order = np.argsort(g, kind="stable")  # cheap when already grouped (hosts' ranks)
    counts = np.bincount(g, minlength=n_groups)
    size = int(counts.max())
    if size and np.all((counts == size) | (counts == 0)):  # the usual case: equal groups
        s = np.sort(v[order].reshape(-1, size), axis=1)
        has = counts > 0
        out[has] = 0.5 * (s[:, (size - 1) // 2] + s[:, size // 2])
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


def quiet_nan(fn: Any, values: Any, axis: int | None = None) -> Any:
    """``fn(values, axis=axis)`` for one of ``np.nanmedian``, ``np.nanmean``, ``np.nanmin`` or
    ``np.nanmax``, with all-NaN slices giving NaN *without* numpy's RuntimeWarning.

    Detection runs in the service's background threads, where silencing those warnings with
    ``warnings.catch_warnings`` is not an option: it saves and restores the process-wide filter
    list, so two threads doing it at once can drop each other's filters (the detection thread
    once removed the filter FastAPI sets while it builds a route, in another thread).
    """
    x = np.asarray(values)
    if x.dtype.kind != "f":
        x = x.astype(np.float64)  # float32 history stays float32, as numpy would compute it
    has = ~np.isnan(x)
    if axis is None:
        return fn(x) if has.any() else x.dtype.type(np.nan)
    has = has.any(axis=axis, keepdims=True)
    if has.all():
        return fn(x, axis=axis)
    out = fn(np.where(has, x, x.dtype.type(0)), axis=axis, keepdims=True)
    return np.squeeze(np.where(has, out, x.dtype.type(np.nan)), axis=axis)
