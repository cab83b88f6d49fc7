"""What node agents' envelopes vouch for (docs/ingest-v1.md, "Completeness"): the SDK ends each
hand-over with a mark, the agent vouches for the oldest of its processes' marks, and for nothing
while any source does not mark."""

from __future__ import annotations

import gzip
import socket
from pathlib import Path

from failslow.agents import wire
from failslow.agents.sdk import Recorder
from failslow.agents.vouch import WINDOW_S, Vouches

MS = 1_000_000


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_oldest_process_mark_is_vouched_for_and_an_unmarked_one_stops_it() -> None:
    clock = Clock()
    v = Vouches(clock)
    assert v.current(10_000 * MS) == {}  # nobody said anything
    v.note(11, records=True, mark=(950 * MS, 250 * MS))
    v.note(12, records=False, mark=(800 * MS, 500 * MS))
    assert v.current(10_000 * MS) == {"complete_ns": 800 * MS, "inflight_after_ns": 500 * MS}
    assert v.current(700 * MS)["complete_ns"] == 700 * MS  # never after the envelope's send
    v.note(13, records=True, mark=None)  # an SDK that does not mark (an older one)
    assert v.current(10_000 * MS) == {}
    clock.t += WINDOW_S  # ... gone since: the others vouch again (13 forgotten)
    v.note(11, records=False, mark=(2_000 * MS, 250 * MS))
    v.note(12, records=False, mark=(2_100 * MS, 250 * MS))
    assert v.current(10_000 * MS) == {"complete_ns": 2_000 * MS, "inflight_after_ns": 250 * MS}
    v.note(None, records=True, mark=None)  # a source of the agent's own (NCCL Inspector)
    assert v.current(10_000 * MS) == {}
    v.note(None, records=False, mark=None)  # (announcements only: no records)
    clock.t += WINDOW_S
    v.note(11, records=False, mark=(3_000 * MS, 250 * MS))
    assert v.current(10_000 * MS) == {"complete_ns": 3_000 * MS, "inflight_after_ns": 250 * MS}


def test_a_hand_over_ends_with_its_mark_sent_even_without_records(tmp_path: Path) -> None:
    agent = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    agent.bind(str(tmp_path / "agent.sock"))
    agent.settimeout(5)
    r = Recorder("job1", socket_path=str(tmp_path / "agent.sock"), start=False)
    marks = iter([(5_000, 250 * MS), (6_000, 250 * MS)])
    r.watermark = lambda: next(marks)
    r.record_collective(rank=0, comm="dp", seq=0, op="allreduce", nbytes=8, start_ns=1, end_ns=2)
    r._drain()
    r._deliver()
    r._drain()  # nothing recorded since: the mark alone
    r._deliver()
    payloads = [wire.decode_payload(agent.recv(65536))[1] for _ in range(2)]
    agent.close()
    r.close(timeout_s=0)
    assert [[m[0] for m in items] for items in payloads] == [["c", "w"], ["w"]]
    assert payloads[0][-1] == ["w", 5_000, 250 * MS] and payloads[1][0] == ["w", 6_000, 250 * MS]
    assert r.stats.sent == 1  # a mark is no record
    # in a spool directory a process marks only with records (a file per flush otherwise)
    spool = Recorder("job1", spool_dir=str(tmp_path / "spool"), start=False)
    spool.watermark = lambda: (7_000, 250 * MS)
    spool._drain()
    spool._deliver()
    assert list((tmp_path / "spool").iterdir()) == []


def test_a_sealed_envelope_carries_what_its_processes_vouched_for(tmp_path: Path) -> None:
    """Through a real node agent (v2, the default): the SDK processes' marks become the sealed
    envelope's ``complete_ns`` / ``inflight_after_ns``; a payload without marks stops it."""
    from failslow.agents.agent import NodeAgent
    from failslow.wire import v2

    agent = NodeAgent(service="http://127.0.0.1:9", job="jv", host="h0",
                      state_dir=str(tmp_path / "state"), fsync=False)  # fmt: skip
    try:
        announce = [["r", 0, 0, 2], ["r", 1, 1, 2], ["m", "dp", "dp", [0, 1]]]
        now = 1_780_000_000_000 * MS
        for pid, rank, mark in ((101, 0, now - 300 * MS), (102, 1, now - 200 * MS)):
            items = [*announce, ["c", rank, "dp", 0, "allreduce", 8, now - 2 * MS, now - MS, None],
                     ["w", mark, 250 * MS]]  # fmt: skip
            agent.add_payload(wire.header("jv", pid) + b"\n" + wire.encode_lines(items))
        seq = agent.seal()
        assert seq is not None
        _, payload, _ = agent.outbox.oldest()  # type: ignore[misc]
        header, _ = v2.decode_header(gzip.decompress(payload))
        assert header["complete_ns"] == now - 300 * MS and header["inflight_after_ns"] == 250 * MS
        plain = [["c", 0, "dp", 1, "allreduce", 8, now, now + MS, None]]  # no mark: an old SDK
        agent.add_payload(wire.header("jv", 103) + b"\n" + wire.encode_lines(plain))
        bad = agent.stats.bad_messages
        agent.add_payload(wire.header("jv", 104) + b"\n" + wire.encode_lines([["w", "x"]]))
        assert agent.stats.bad_messages == bad + 1  # a broken mark: counted, never raised
        agent.seal()
        agent.outbox.ack(seq)
        _, payload, _ = agent.outbox.oldest()  # type: ignore[misc]
        header, _ = v2.decode_header(gzip.decompress(payload))
        assert "complete_ns" not in header and "inflight_after_ns" not in header
    finally:
        agent.sender.close()
