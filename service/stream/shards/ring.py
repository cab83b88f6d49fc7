"""Member records from a job's owner to one shard through shared memory: one copy in, one copy
out. Pickling ~300 MB of columns through a pipe cost the owner 0.64 s of CPU and the shard 0.19
s (10K ranks, 11 steps; the pipe's kernel copies and wake-ups), more than the join it moved.

A single-producer, single-consumer ring over a ``multiprocessing.shared_memory`` segment:
positions only grow (bytes written, bytes freed); the first 64 bytes hold the consumer's
position, which the owner reads to know what it may overwrite. A message is a run of columns,
each aligned to 8 bytes, never split across the end (the writer skips to the start instead); its
place and shape go through the pipe, in order with every other request.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from multiprocessing import shared_memory

import numpy as np

HEADER = 64
Columns = list[tuple[str, str, int]]  # name, dtype, length


def _align(n: int) -> int:
    return (n + 7) & ~7


class Ring:
    """One end of the ring: the owner's (``create``) or the shard's (attach by ``name``)."""

    def __init__(self, size: int = 0, name: str | None = None) -> None:
        if name is None:
            self.shm = shared_memory.SharedMemory(create=True, size=HEADER + size)
        else:
            # (a spawned process shares its parent's resource tracker: the owner's registration
            # stands, and the owner unlinks it)
            self.shm = shared_memory.SharedMemory(name=name)
        self.cap = self.shm.size - HEADER
        self.freed = np.ndarray((1,), np.int64, self.shm.buf, 0)  # the consumer's position
        self.data = np.ndarray((self.cap,), np.uint8, self.shm.buf, HEADER)
        self.head = 0  # the producer's position

    @property
    def name(self) -> str:
        return self.shm.name

    def write(
        self,
        cols: dict[str, np.ndarray],
        wait: Callable[[], None],
        dtypes: dict[str, type] | None = None,
    ) -> tuple[int, Columns] | None:
        """Copy ``cols`` in (as ``dtypes``, where given: converted on the way); their place and
        shape, or None when they could never fit (the caller sends them another way). ``wait``:
        called while the shard has not freed enough (it raises when the shard is gone)."""
        dtypes = dtypes or {}
        kinds = [np.dtype(dtypes.get(c, v.dtype)) for c, v in cols.items()]
        sizes = [_align(v.size * k.itemsize) for v, k in zip(cols.values(), kinds, strict=True)]
        need = sum(sizes)
        if need > self.cap // 2:
            return None
        at = self.head % self.cap
        if at + need > self.cap:  # never across the end: skip to the start
            self.head += self.cap - at
            at = 0
        while self.head + need - int(self.freed[0]) > self.cap:
            wait()
        layout: Columns = []
        off = at
        for (name, v), kind, size in zip(cols.items(), kinds, sizes, strict=True):
            if v.size:
                np.copyto(np.ndarray((v.size,), kind, self.data, off), v, casting="unsafe")
            layout.append((name, kind.str, int(v.size)))
            off += size
        start = self.head
        self.head += need
        return start, layout

    def read(self, start: int, layout: Columns, dtypes: dict[str, type]) -> dict[str, np.ndarray]:
        """Copy a message out (as ``dtypes``) and free its place."""
        at = start % self.cap
        out: dict[str, np.ndarray] = {}
        for name, dtype, n in layout:
            dt = np.dtype(dtype)
            view = np.ndarray((n,), dt, self.data, at) if n else np.zeros(0, dt)
            out[name] = view.astype(dtypes.get(name, dt))  # a copy, in the join's dtype
            at += _align(n * dt.itemsize)
        self.freed[0] = start + (at - start % self.cap)
        return out

    def close(self, unlink: bool = False) -> None:
        del self.freed, self.data
        self.shm.close()
        if unlink:
            self.shm.unlink()


def wait_a_little() -> None:
    time.sleep(0.0005)
