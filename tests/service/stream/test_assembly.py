"""Assembly of collectives from members reporting in any order, from any host."""

from __future__ import annotations

import itertools

import pytest

from failslow.detectors.types import P2P
from failslow.service.stream.assembly import Assembler, Outcome
from failslow.service.stream.parse import parse_collective
from failslow.service.stream.records import CommAnnouncement, RecordError
from failslow.service.stream.topology import Topology
from tests.helpers import MS, T0, coll


def make(n: int = 4, **kw: int) -> tuple[Assembler, Topology]:
    topo = Topology(max_ranks=100, max_comms=10)
    topo.announce_comm(CommAnnouncement("dp-0", "dp", tuple(range(n))))
    topo.announce_comm(CommAnnouncement("p2p-0", "p2p", (0, 1)))
    args = {"max_pending": 1000, "max_done": 1000, "retention_ns": 60_000 * MS} | kw
    return Assembler(**args), topo


def offer(a: Assembler, topo: Topology, rec: dict) -> Outcome:  # type: ignore[type-arg]
    r = parse_collective(rec)
    return a.offer(r, topo.comms[r.comm])


@pytest.mark.parametrize("order", list(itertools.permutations(range(4))))
def test_any_arrival_order_completes_exactly_once(order: tuple[int, ...]) -> None:
    a, topo = make()
    starts = [T0, T0 + MS, T0 + 2 * MS, T0 + 30 * MS]
    for i, member in enumerate(order):
        assert offer(a, topo, coll(member, 7, starts[member], T0 + 31 * MS)) is Outcome.NEW
        assert a.ready_count == (1 if i == 3 else 0)
    (done,) = a.take_ready()
    assert (done.size, done.comm.tolist()) == (4, [topo.comms["dp-0"].index])
    assert done.starts.tolist() == [starts]  # in comm order, whatever the arrival order
    assert done.ebytes.tolist() == [1024 * 2 * 3 / 4]  # allreduce bus factor 2(n-1)/n
    assert topo.member_slots(4, done.comm).tolist() == [[0, 1, 2, 3]]
    assert not a.pending


def test_resends_after_completion_are_duplicates_and_changes_are_conflicts() -> None:
    a, topo = make(n=2)
    offer(a, topo, coll(0, 0, T0, T0 + MS))
    offer(a, topo, coll(1, 0, T0, T0 + MS))
    assert offer(a, topo, coll(1, 0, T0, T0 + MS)) is Outcome.DUPLICATE
    assert offer(a, topo, coll(1, 0, T0, None)) is Outcome.DUPLICATE  # stale in-flight copy
    with pytest.raises(RecordError, match="conflicting"):
        offer(a, topo, coll(1, 0, T0, T0 + 2 * MS))
    with pytest.raises(RecordError, match="conflicting"):
        offer(a, topo, coll(1, 0, T0, T0 + MS, nbytes=5))


def test_inflight_then_completed() -> None:
    a, topo = make(n=2)
    assert offer(a, topo, coll(0, 0, T0, None)) is Outcome.NEW
    assert offer(a, topo, coll(1, 0, T0, T0 + MS)) is Outcome.NEW
    assert len(a.inflight()) == 1 and a.ready_count == 0
    assert offer(a, topo, coll(0, 0, T0, T0 + MS)) is Outcome.COMPLETED
    assert a.ready_count == 1 and not a.inflight()


def test_send_recv_pair_assembles_with_peers() -> None:
    a, topo = make()
    offer(a, topo, coll(1, 0, T0, T0 + MS, comm="p2p-0", op="irecv", peer=0))
    offer(a, topo, coll(0, 0, T0, T0 + MS, comm="p2p-0", op="isend", peer=1))
    (batch,) = a.take_ready()
    assert batch.kind.tolist() == [P2P] and batch.ebytes.tolist() == [1024.0]
    with pytest.raises(RecordError, match="peer 3"):
        offer(a, topo, coll(0, 1, T0, T0 + MS, comm="p2p-0", op="send", peer=3))


def test_retention_expires_incomplete_collectives_and_remembers_them() -> None:
    a, topo = make(retention_ns=10 * MS)
    offer(a, topo, coll(0, 0, T0, T0 + MS))
    assert a.expire(T0 + 5 * MS) == 0
    assert a.expire(T0 + 20 * MS) == 1
    assert a.expired == 1 and not a.pending
    # a straggling member of the expired collective is counted apart, not re-opened
    assert offer(a, topo, coll(1, 0, T0, T0 + MS)) is Outcome.DUPLICATE
    assert a.assumed_duplicates == 1


def test_pending_is_bounded() -> None:
    a, topo = make(max_pending=5)
    for seq in range(8):
        offer(a, topo, coll(0, seq, T0 + seq, T0 + seq + 1))
    assert len(a.pending) == 5 and a.expired == 3


def test_done_memory_is_bounded() -> None:
    a, topo = make(n=1, max_done=3)
    for seq in range(10):
        offer(a, topo, coll(0, seq, T0 + seq, T0 + seq + 1))
    assert len(a.done) == 3
    assert a.retired_seq["dp-0"] == 6
    assert a.take_ready()[0].starts[:, 0].tolist() == [T0 + seq for seq in range(10)]
