"""Clock-free lateness of each member of a collective, from its members' own durations.

In a synchronising collective every member leaves at about the same time, once the last one has
arrived and the data has moved. The last arriver therefore shows the *shortest* duration, and each
other member's extra duration is time spent waiting for it. Only durations (end - start on one
host's clock) are used, so clock offsets between hosts do not matter. This is the observation
behind Alibaba C4's collective "syndromes" and NVIDIA's straggler detection, which exclude NCCL
time from compute scores because the slow rank waits least.
"""

from __future__ import annotations

import numpy as np

from failslow.detectors.robust import _loo_median_sorted, loo_median


def collective_lateness(durations: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per member, ``(lateness, wait)`` in the unit of ``durations`` (rows = collectives).

    ``lateness[i] = max(0, median of the other members' durations - duration[i])``: how long a
    typical peer waited for member ``i``. ``wait[i] = duration[i] - min(duration)``: how long member
    ``i`` itself waited for the last arriver. Shapes: (collectives, members).
    """
    d = np.asarray(durations, dtype=np.float64)
    if d.ndim == 1:
        d = d[None, :]
    others = loo_median(d)
    lateness = np.maximum(0.0, np.nan_to_num(others - d, nan=0.0))
    wait = d - np.nanmin(d, axis=1, keepdims=True)
    return lateness, wait


def collective_stats(durations: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The lateness of :func:`collective_lateness` and each row's shortest duration (the last
    arriver's, about the pure transfer time): ``(lateness, shortest)``. Durations measured from
    integer timestamps are always finite; then one sort per row gives both."""
    d = np.asarray(durations, dtype=np.float64)
    if d.ndim == 1:
        d = d[None, :]
    if d.shape[1] == 0 or not np.isfinite(d).all():
        late, _ = collective_lateness(d)
        return late, np.nanmin(d, axis=1) if d.shape[1] else np.full(d.shape[0], np.nan)
    if d.shape[1] == 2:  # a pair (send/recv): the other's duration, no sort needed
        late = d[:, ::-1] - d
        np.maximum(late, 0.0, out=late)
        return late, np.minimum(d[:, 0], d[:, 1])
    s = np.sort(d, axis=1)
    if d.shape[1] < 2:
        late = np.zeros_like(d)
    else:
        late = _loo_median_sorted(d, s)
        late -= d
        np.maximum(late, 0.0, out=late)
    return late, s[:, 0]
