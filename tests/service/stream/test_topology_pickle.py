"""A job's topology survives the pickling of a snapshot whole: ranks, hosts and comms by position
(``topology._PICKLE``), a comm's member slots and positions rebuilt from what was stored."""

from __future__ import annotations

import pickle

import numpy as np

from failslow.detectors.vocab import CommKind
from failslow.service.stream.records import CommAnnouncement, RankAnnouncement
from failslow.service.stream.topology import Topology


def test_a_topology_round_trips_through_pickle() -> None:
    topo = Topology(max_ranks=64, max_comms=64)
    for r in (5, 1, 7, 3):  # slots in order of announcement, not of rank
        topo.announce_rank(f"h{r % 2}", RankAnnouncement(rank=r, gpu=r % 2, world_size=8))
    topo.announce_comm(CommAnnouncement("tp", CommKind.TP, (7, 5)))
    topo.announce_comm(CommAnnouncement("dp", CommKind.DP, (3, 1, 9)))  # 9: a new rank
    back = pickle.loads(pickle.dumps(topo, protocol=pickle.HIGHEST_PROTOCOL))
    assert back.ranks == topo.ranks and back.hosts == topo.hosts
    assert list(back.comms) == list(topo.comms)
    for name, c in topo.comms.items():
        b = back.comms[name]
        assert (b.comm, b.kind, b.ranks, b.index, b.position) == (
            c.comm, c.kind, c.ranks, c.index, c.position
        )  # fmt: skip
        assert b.slots.dtype == np.int64 and np.array_equal(b.slots, c.slots)
        assert b.slots.flags.writeable  # a copy, not a view of the pickle's bytes
    assert back.comm_list[1] is back.comms["dp"]  # one object, as before
    assert back.comms["dp"].slots.tolist() == [topo.slot(3), topo.slot(1), topo.slot(9)]
