"""A shard's view of its job's topology: per comm, its member count, kind column and member
slots (in comm order), kept in step with the owner's :class:`Topology` by appending what is new
(comms are only ever appended; a comm's members never change)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from failslow.service.stream.topology import Topology


@dataclass(frozen=True, slots=True)
class TableDelta:
    """The comms ``first..`` of a job and its slot count, as the owner sends them."""

    first: int
    n_slots: int
    sizes: np.ndarray
    kinds: np.ndarray
    slots: np.ndarray  # members of every new comm, end to end


def delta_of(topology: Topology, first: int) -> TableDelta:
    """What a shard that knows the comms before ``first`` lacks of ``topology``'s."""
    sizes, kinds = topology.comm_arrays()
    new = topology.comm_list[first:]
    flat = np.concatenate([c.slots for c in new]) if new else np.zeros(0, np.int64)
    return TableDelta(first, topology.n_slots, sizes[first:].copy(), kinds[first:].copy(), flat)


class CommTable:
    """Implements :class:`~failslow.service.stream.topology.CommTable` from deltas."""

    def __init__(self) -> None:
        self.sizes = np.zeros(0, np.int64)
        self.kinds = np.zeros(0, np.int64)
        self.flat = np.zeros(0, np.int64)
        self.offsets = np.zeros(0, np.int64)
        self._n_slots = 0
        self._tables: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    @property
    def n_slots(self) -> int:
        return self._n_slots

    @property
    def n_comms(self) -> int:
        return int(self.sizes.size)

    def extend(self, d: TableDelta) -> None:
        if d.first != self.n_comms:
            raise ValueError(f"comm table at {self.n_comms}, delta from {d.first}")
        self._n_slots = max(self._n_slots, d.n_slots)
        if not d.sizes.size:
            return
        self.offsets = np.concatenate([self.offsets, self.flat.size + np.cumsum(d.sizes) - d.sizes])
        self.sizes = np.concatenate([self.sizes, d.sizes])
        self.kinds = np.concatenate([self.kinds, d.kinds])
        self.flat = np.concatenate([self.flat, d.slots])
        self._tables.clear()

    def comm_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return self.sizes, self.kinds

    def slot_table(self, size: int) -> tuple[np.ndarray, np.ndarray]:
        table = self._tables.get(size)
        if table is None:
            rows = np.flatnonzero(self.sizes == size)
            row_of = np.full(self.n_comms, -1, np.int64)
            row_of[rows] = np.arange(rows.size)
            matrix = self.flat[self.offsets[rows][:, None] + np.arange(size)]
            table = self._tables[size] = (matrix, row_of)
        return table

    def member_slots(self, size: int, comm_index: np.ndarray) -> np.ndarray:
        matrix, row_of = self.slot_table(size)
        return matrix[row_of[comm_index]]
