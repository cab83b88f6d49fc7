"""How unusual is each host, jointly over its features? A robust-covariance outlier score.

Per host: the median compute ratio of its ranks against cross-host peers, its ranks' median
lateness fraction in data-parallel comms, and the fraction of its cross-host communicators that
are slow. Minimum Covariance Determinant (Rousseeuw 1984, scikit-learn's ``MinCovDet``) estimates
location and scatter from the most central hosts, so a few faulty hosts cannot hide themselves by
inflating the covariance; the robust Mahalanobis distance then ranks hosts. Used as evidence for
node and link incidents (it runs when one opens, not every frame).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.stats import chi2

from failslow.detectors.findings import rounded
from failslow.detectors.robust import group_median
from failslow.detectors.types import JobShape

MIN_HOSTS = 10  # below this the robust covariance is not identifiable; robust z-scores instead


def _full_rank(xs: np.ndarray) -> bool:
    """MinCovDet's own full-rank test of the scatter (singular values of X^T X above 1e-8)."""
    return bool((np.linalg.svd(xs.T @ xs, compute_uv=False) > 1e-8).sum() == xs.shape[1])


def host_outlier_scores(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(distance, p_value)`` per host row; rows with missing features get NaN."""
    x = np.asarray(features, dtype=np.float64)
    ok = np.isfinite(x).all(axis=1)
    dist = np.full(x.shape[0], np.nan)
    pval = np.full(x.shape[0], np.nan)
    xs = x[ok]
    if xs.shape[0] < 3:
        return dist, pval
    spread = np.median(np.abs(xs - np.median(xs, axis=0)), axis=0) * 1.4826
    keep = spread > 1e-9  # constant features carry no information
    if not keep.any():
        dist[ok] = 0.0
        pval[ok] = 1.0
        return dist, pval
    xs = xs[:, keep]
    # MinCovDet needs a full-rank scatter (its own test, which it would only warn about); hosts
    # that are near-identical in some direction get the robust z-scores instead. No
    # warnings.catch_warnings around it: detection runs in a background thread, and that context
    # manager swaps the process-wide filter list (see robust.quiet_nan). scikit-learn's input
    # validation still does so itself, briefly, once per node or link incident of 10+ hosts.
    if xs.shape[0] >= max(MIN_HOSTS, 3 * xs.shape[1]) and _full_rank(xs):
        from sklearn.covariance import MinCovDet

        mcd = MinCovDet(support_fraction=0.75, random_state=0).fit(xs)
        d2 = mcd.mahalanobis(xs)
    else:
        z = (xs - np.median(xs, axis=0)) / spread[keep]
        d2 = (z**2).sum(axis=1)
    dist[ok] = np.sqrt(d2)
    pval[ok] = chi2.sf(d2, df=xs.shape[1])
    return dist, pval


def host_outliers(
    shape: JobShape,
    cross: np.ndarray,
    late_fraction: np.ndarray,
    host_slow_fraction: np.ndarray,
    hosts: tuple[str, ...],
) -> dict[str, Any]:
    """Evidence for an incident on ``hosts``: their robust outlier distance among all hosts over
    the per-host features above (``cross``, ``late_fraction`` per rank slot of the last frame)."""
    n = min(late_fraction.size, cross.size, shape.host_of_slot.size)
    host = shape.host_of_slot[:n]
    feats = np.column_stack(
        [
            group_median(cross[:n], host, shape.n_hosts),
            group_median(late_fraction[:n], host, shape.n_hosts),
            np.nan_to_num(host_slow_fraction[: shape.n_hosts], nan=0.0),
        ]
    )
    dist, pval = host_outlier_scores(feats)
    out = {}
    for h in hosts:
        if h in shape.hosts:
            i = shape.hosts.index(h)
            out[h] = {"distance": rounded(dist[i], 2), "p_value": rounded(pval[i], 6)}
    rank = np.argsort(-np.nan_to_num(dist, nan=-1.0))[:3]
    return {
        "hosts": out,
        "most_unusual": [shape.hosts[i] for i in rank if np.isfinite(dist[i])],
        "method": "robust Mahalanobis distance (MinCovDet) over per-host features",
    }
