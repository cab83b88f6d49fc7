"""Partial frames added up: the owner's (step records, and what it placed before the job was
split) and every shard's (its comms' collectives). Per slot and per comm the accumulators are
sums, so adding them gives the frame one process would have built."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from failslow.detectors.types import Frame


def _sum(arrays: list[np.ndarray]) -> np.ndarray:
    """Element-wise sum of arrays whose first dimension may differ (shorter: zeros past it)."""
    n = max(a.shape[0] for a in arrays)
    out = np.zeros((n, *arrays[0].shape[1:]), dtype=np.result_type(*arrays))
    for a in arrays:
        out[: a.shape[0]] += a
    return out


def _fill(a: np.ndarray, n: int, value: float) -> np.ndarray:
    if a.shape[0] >= n:
        return a
    return np.concatenate([a, np.full(n - a.shape[0], value, dtype=a.dtype)])


def add_frames(parts: list[Frame]) -> Frame:
    """One frame from the parts of the same index (the first part's step records stand: every
    part has the same ones)."""
    if len(parts) == 1:
        return parts[0]
    base = max(parts, key=lambda f: int(np.count_nonzero(~np.isnan(f.step_time))))
    busy = _sum([f.busy for f in parts])
    n = busy.shape[0]
    return replace(
        base,
        start_ns=min(f.start_ns for f in parts),
        end_ns=max(f.end_ns for f in parts),
        step_time=_fill(base.step_time, n, np.nan),
        work=_fill(base.work, n, np.nan),
        busy=busy,
        comm_time=busy.sum(axis=1),
        late=_sum([f.late for f in parts]),
        calls=_sum([f.calls for f in parts]),
        collectives=sum(f.collectives for f in parts),
        comm_transfer=_sum([f.comm_transfer for f in parts]),
        comm_bytes=_sum([f.comm_bytes for f in parts]),
        comm_calls=_sum([f.comm_calls for f in parts]),
    )


def reduce_frames(groups: list[list[Frame]]) -> list[Frame]:
    """The frames closed by the owner and by each shard, by index, oldest first."""
    by_index: dict[int, list[Frame]] = {}
    for frames in groups:
        for f in frames:
            by_index.setdefault(f.index, []).append(f)
    return [add_frames(by_index[i]) for i in sorted(by_index)]
