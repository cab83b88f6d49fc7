"""Bus bandwidth of a collective, as nccl-tests defines it.

``busbw = bytes * factor(op, n) / time``: the factor turns the algorithm bandwidth of each op into
the bandwidth every link of a ring must sustain (nccl-tests, doc/PERFORMANCE.md), so that
collectives of different kinds and sizes can be compared with each other and with the hardware.
"""

from __future__ import annotations

import numpy as np

from failslow.detectors.vocab import Op


def bus_factor(op: str, n: int) -> float:
    if n < 2 or op == Op.BARRIER:
        return 0.0
    if op == Op.ALLREDUCE:
        return 2.0 * (n - 1) / n
    if op in (Op.ALLGATHER, Op.REDUCESCATTER, Op.ALLTOALL):
        return (n - 1) / n
    return 1.0  # broadcast, reduce, send/recv


def bus_bandwidth(nbytes: np.ndarray, factor: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Bytes per second; NaN where there is no transfer to measure."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where((seconds > 0) & (factor > 0), nbytes * factor / seconds, np.nan)
