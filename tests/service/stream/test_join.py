"""The join: collectives from member records staged in any order, from any host, in any number of
passes; and the v1 ledger's answers to re-sends."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from failslow.detectors.types import P2P
from failslow.service.stream.join import COLUMNS, Joiner
from failslow.service.stream.ledger import Ledger
from failslow.service.stream.parse import parse_collective
from failslow.service.stream.records import CommAnnouncement, Outcome, RecordError
from failslow.service.stream.topology import Topology
from failslow.wire.v2 import NO_END, OP_CODE
from tests.helpers import MS, T0, coll


def make(n: int = 4, **kw: int) -> tuple[Joiner, Topology]:
    topo = Topology(max_ranks=100, max_comms=10)
    topo.touch_host("h0", T0, 0.0)
    topo.announce_comm(CommAnnouncement("dp-0", "dp", tuple(range(n))))
    topo.announce_comm(CommAnnouncement("p2p-0", "p2p", (0, 1)))
    args = {"max_pending": 1000, "retention_ns": 60_000 * MS} | kw
    return Joiner(**args), topo


def stage(j: Joiner, topo: Topology, *recs: dict[str, Any], seen: int = T0) -> None:
    rows = [parse_collective(r) for r in recs]
    comms = [topo.comms[r.comm] for r in rows]
    j.stage(
        {
            "comm": np.array([c.index for c in comms], np.int64),
            "seq": np.array([r.seq for r in rows], np.int64),
            "pos": np.array(
                [c.position[r.rank] for r, c in zip(rows, comms, strict=True)],
                np.int64,
            ),
            "slot": np.array([topo.slot(r.rank) for r in rows], np.int64),
            "op": np.array([OP_CODE[r.op] for r in rows], np.uint8),
            "nbytes": np.array([r.nbytes for r in rows], np.int64),
            "start": np.array([r.start_ns for r in rows], np.int64),
            "end": np.array([NO_END if r.end_ns is None else r.end_ns for r in rows], np.int64),
            "seen": np.full(len(rows), seen, np.int64),
        },
        topo.n_slots,
    )


def join(j: Joiner, topo: Topology):  # type: ignore[no-untyped-def]
    return j.join(*topo.comm_arrays())


@pytest.mark.parametrize("order", list(itertools.permutations(range(4))))
@pytest.mark.parametrize("passes", [1, 4])
def test_any_arrival_order_completes_exactly_once(order: tuple[int, ...], passes: int) -> None:
    j, topo = make()
    starts = [T0, T0 + MS, T0 + 2 * MS, T0 + 30 * MS]
    batches = []
    for member in order:
        stage(j, topo, coll(member, 7, starts[member], T0 + 31 * MS))
        if passes == 4:
            batches += join(j, topo)
    batches += join(j, topo)
    (done,) = batches
    assert (done.size, done.comm.tolist()) == (4, [topo.comms["dp-0"].index])
    assert done.starts.tolist() == [starts]  # in comm order, whatever the arrival order
    assert done.ebytes.tolist() == [1024 * 2 * 3 / 4]  # allreduce bus factor 2(n-1)/n
    assert topo.member_slots(4, done.comm).tolist() == [[0, 1, 2, 3]]
    assert j.pending_groups == 0 and j.pending["comm"].size == 0


def test_many_collectives_of_several_sizes_in_one_pass() -> None:
    j, topo = make()
    recs = [coll(r, s, T0 + s * MS, T0 + s * MS + 5) for s in range(50) for r in range(4)]
    recs += [coll(0, 0, T0, T0 + MS, comm="p2p-0", op="send", peer=1)]
    recs += [coll(1, 0, T0, T0 + MS, comm="p2p-0", op="recv", peer=0)]
    recs += [coll(r, 50, T0, T0 + MS) for r in range(3)]  # one member missing
    rng = np.random.default_rng(3)
    stage(j, topo, *[recs[i] for i in rng.permutation(len(recs))])
    batches = {b.size: b for b in join(j, topo)}
    assert len(batches[4]) == 50 and len(batches[2]) == 1
    assert batches[2].kind.tolist() == [P2P] and batches[2].ebytes.tolist() == [1024.0]
    assert j.pending_groups == 1 and j.inflight_count() == 0


def test_inflight_then_completed_and_duplicates_and_conflicts() -> None:
    j, topo = make(n=2)
    stage(j, topo, coll(0, 0, T0, None), coll(1, 0, T0, T0 + MS))
    assert join(j, topo) == [] and j.inflight_count() == 1
    (g,) = j.groups()
    assert g.positions.tolist() == [0, 1] and g.ends.tolist() == [NO_END, T0 + MS]
    stage(j, topo, coll(0, 0, T0, T0 + MS), coll(1, 0, T0, T0 + MS))  # completion + duplicate
    stage(j, topo, coll(0, 1, T0, T0 + MS), coll(0, 1, T0, T0 + 2 * MS))  # a conflict
    (batch,) = join(j, topo)
    assert batch.ends.tolist() == [[T0 + MS, T0 + MS]]
    assert (j.duplicates, j.conflicts) == (1, 1)
    assert j.inflight_count() == 0 and j.pending_groups == 1  # seq 1 waits for member 1


def test_retention_and_the_cap_drop_the_oldest() -> None:
    j, topo = make(retention_ns=10 * MS, max_pending=5)
    for seq in range(8):
        stage(j, topo, coll(0, seq, T0 + seq, T0 + seq + 1))
    join(j, topo)
    assert j.pending_groups == 5 and j.expired == 3
    assert sorted({g.seq for g in j.groups()}) == [3, 4, 5, 6, 7]
    assert j.expire(T0 + 5 * MS).shape == (0, 2)
    gone = j.expire(T0 + 20 * MS)
    assert sorted(gone[:, 1].tolist()) == [3, 4, 5, 6, 7] and j.pending_groups == 0


def test_hang_views_follow_arrival_order() -> None:
    j, topo = make(n=2)
    stage(j, topo, coll(0, 5, T0, None), seen=T0)
    stage(j, topo, coll(0, 6, T0 + 100 * MS, None), seen=T0 + MS)
    stage(j, topo, coll(1, 7, T0 + 200 * MS, T0 + 201 * MS), seen=T0 + 2 * MS)
    join(j, topo)
    assert [g.seq for g in j.groups()] == [5, 6, 7]
    # old: seq 5; then only the younger ones somebody is inside (6, not 7)
    assert [g.seq for g in j.groups(started_before_ns=T0 + 50 * MS)] == [5, 6]
    assert j.groups(started_before_ns=T0 - 1) == []
    assert j.last_end[topo.ranks[1].slot] == T0 + 201 * MS
    assert j.abandon() == 3 and j.pending_groups == 0


def test_hang_views_can_leave_out_what_nobody_is_inside() -> None:
    """An old collective whose reported members all completed (the others are merely late) is
    of no use to the hang detector and must not use up the limit."""
    j, topo = make(n=2)
    stage(j, topo, coll(0, 4, T0 - 100 * MS, T0 - 99 * MS), seen=T0)
    stage(j, topo, coll(0, 5, T0, None), seen=T0 + MS)
    join(j, topo)
    assert [g.seq for g in j.groups(started_before_ns=T0 + 50 * MS, limit=1)] == [4]
    only = j.groups(started_before_ns=T0 + 50 * MS, limit=1, inside_only=True)
    assert [g.seq for g in only] == [5]
    assert [g.seq for g in j.groups(inside_only=True)] == [5]


def test_ledger_answers_resends() -> None:
    led = Ledger(max_entries=1000)
    c = parse_collective
    assert led.check(0, 0, c(coll(0, 0, T0, T0 + MS))) is Outcome.NEW
    assert led.check(0, 0, c(coll(0, 0, T0, T0 + MS))) is Outcome.DUPLICATE
    assert led.check(0, 0, c(coll(0, 0, T0, None))) is Outcome.DUPLICATE  # stale in-flight copy
    with pytest.raises(RecordError, match="conflicting"):
        led.check(0, 0, c(coll(0, 0, T0, T0 + 2 * MS)))
    with pytest.raises(RecordError, match="conflicting"):
        led.check(0, 0, c(coll(0, 0, T0, T0 + MS, nbytes=5)))
    assert led.check(0, 1, c(coll(1, 0, T0, None))) is Outcome.NEW
    assert led.check(0, 1, c(coll(1, 0, T0, T0 + MS))) is Outcome.COMPLETED


def test_ledger_is_bounded_and_forgets_by_number() -> None:
    led = Ledger(max_entries=3)
    for seq in range(10):
        led.check(0, 0, parse_collective(coll(0, seq, T0 + seq, T0 + seq + 1)))
    assert len(led.entries) == 3 and led.retired_seq[0] == 6
    assert led.check(0, 0, parse_collective(coll(0, 2, T0, T0 + 1))) is Outcome.DUPLICATE
    assert led.assumed_duplicates == 1


def _feed(rng: np.random.Generator, n_coll: int) -> dict[str, np.ndarray]:
    """Member records of ``n_coll`` collectives over comms of sizes 4, 2 and 3 (indices 0-2), in
    a random arrival order, with some members missing, re-sent, in flight then completed, or
    contradicting their first report."""
    sizes = (4, 2, 3)
    rows = []
    for _ in range(n_coll):
        comm = int(rng.integers(3))
        seq = int(rng.integers(40))
        for pos in range(sizes[comm]):
            if rng.random() < 0.1:
                continue  # never arrives
            start = T0 + seq * MS + int(rng.integers(1000))
            end = start + 5 * MS
            kinds = rng.random()
            if kinds < 0.15:
                rows.append((comm, seq, pos, start, NO_END))  # in flight, completed later
            if kinds > 0.9:
                rows.append((comm, seq, pos, start + 1, end))  # contradicts what follows
            rows.append((comm, seq, pos, start, end))
            if rng.random() < 0.1:
                rows.append((comm, seq, pos, start, end))  # re-sent
    arr = np.array(rows, np.int64).reshape(-1, 5)[rng.permutation(len(rows))]
    n = arr.shape[0]
    return {
        "comm": arr[:, 0], "seq": arr[:, 1], "pos": arr[:, 2], "slot": arr[:, 2],
        "op": np.zeros(n, np.uint8), "nbytes": np.full(n, 64, np.int64),
        "start": arr[:, 3], "end": arr[:, 4], "seen": np.full(n, T0, np.int64),
    }  # fmt: skip


def _run(feed: dict[str, np.ndarray], cuts: list[int], *, whole: bool) -> tuple[Any, ...]:
    """Stage the feed in pieces, joining after each. ``whole``: every join sorts all records
    held (pending ones folded back in with the staged), the plain statement of the join."""
    j = Joiner(max_pending=10_000, retention_ns=60_000 * MS)
    size, kind = np.array([4, 2, 3]), np.zeros(3, np.int64)
    done = []
    for a, b in itertools.pairwise([0, *cuts, feed["comm"].size]):
        j.stage({c: v[a:b] for c, v in feed.items()}, 4)
        if whole and j.pending["comm"].size:
            j.staged.insert(0, j.pending)  # keeps their arrival numbers: first
            j.pending = {c: v[:0] for c, v in j.pending.items()}
        for batch in j.join(size, kind):
            rows = zip(batch.comm, batch.starts.tolist(), batch.ends.tolist(), strict=True)
            done += [(batch.size, int(c), tuple(s), tuple(e)) for c, s, e in rows]
    pending = tuple(tuple(j.pending[c].tolist()) for c in COLUMNS)
    return sorted(done), pending, j.pending_groups, j.conflicts, j.duplicates, j.last_end.tolist()


@pytest.mark.parametrize("seed", range(40))
def test_joining_what_arrived_equals_sorting_everything(seed: int) -> None:
    """A join looks only at the collectives that new records belong to and merges what stays
    incomplete back in order: it completes the same collectives with the same members' data,
    counts the same duplicates and conflicts, and leaves the same pending records in the same
    order as a join that sorts every record held, in any number of passes."""
    rng = np.random.default_rng(seed)
    feed = _feed(rng, 60)
    n = feed["comm"].size
    cuts = sorted(rng.choice(np.arange(1, n), size=min(n - 1, int(rng.integers(1, 30))),
                             replace=False).tolist())  # fmt: skip
    assert _run(feed, cuts, whole=False) == _run(feed, cuts, whole=True)
