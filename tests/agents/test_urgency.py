"""A node agent seals sooner while a call of its ranks is blocked for longer than a step
(agents/urgency.py), with an envelope of no records that vouches that time went on."""

from __future__ import annotations

import gzip
from pathlib import Path

from failslow.agents import wire
from failslow.agents.urgency import MAX_OPEN, STALE_S, Urgency

MS = 1_000_000
T0 = 1_780_000_000_000 * MS


def call(rank: int, seq: int, start: int, end: int | None) -> dict[str, object]:
    return {"rank": rank, "comm": "dp", "seq": seq, "start_ns": start, "end_ns": end}


def step(i: int, ms: int) -> dict[str, object]:
    return {"rank": 0, "step": i, "start_ns": T0 + i * ms * MS, "end_ns": T0 + (i + 1) * ms * MS}


def test_a_call_in_flight_for_longer_than_a_step_is_due_until_it_ends() -> None:
    u = Urgency()
    for i in range(8):  # steps of 400 ms
        u.step(step(i, 400))
    assert u.step_ns() == 400 * MS
    start = T0 + 4 * 1000 * MS
    u.collective(call(0, 7, start, None))
    assert not u.due(start + 300 * MS)  # blocked, but not a whole step: a pipeline bubble
    assert u.due(start + 450 * MS)
    u.collective(call(1, 7, start, start + 10 * MS))  # another rank's end: not this call's
    assert u.due(start + 450 * MS)
    u.collective(call(0, 7, start, start + 460 * MS))
    assert not u.due(start + 500 * MS)


def test_nothing_is_urgent_before_the_first_step_and_never_under_the_least() -> None:
    u = Urgency()
    u.collective(call(0, 0, T0, None))
    assert not u.due(T0 + 5_000 * MS)  # a job starting: its first collectives wait for loading
    for i in range(4):  # 10 ms steps: the least (250 ms) decides
        u.step(step(i, 10))
    assert not u.due(T0 + 200 * MS) and u.due(T0 + 300 * MS)


def test_stale_and_unbounded_calls_are_forgotten() -> None:
    u = Urgency()
    u.step(step(0, 400))
    u.collective(call(0, 0, T0, None))
    assert u.due(T0 + 2_000 * MS)
    assert u.due(T0 + int((STALE_S - 1) * 1e9))
    assert not u.due(T0 + int((STALE_S + 1) * 1e9))  # a hang named long ago, or a lost end
    for i in range(4):  # 4 s steps: five of them are longer than STALE_S
        u.step(step(i, 4_000))
    u.collective(call(1, 0, T0, None))
    assert u.due(T0 + int((STALE_S + 1) * 1e9))
    for i in range(MAX_OPEN + 10):
        u.collective(call(i, 0, T0 + i, None))
    assert len(u._open) == MAX_OPEN


def test_the_agent_seals_a_vouching_envelope_without_records_while_a_call_is_blocked(
    tmp_path: Path,
) -> None:
    """A real node agent: its one process reports a call in flight and then hands over only
    marks; each urgent seal is an envelope of no records whose ``complete_ns`` moved on, none
    when the mark did not move (a frozen process), none when not urgent."""
    from failslow.agents.agent import NodeAgent
    from failslow.wire import v2

    agent = NodeAgent(service="http://127.0.0.1:9", job="ju", host="h0",
                      state_dir=str(tmp_path / "state"), fsync=False)  # fmt: skip

    def hand_over(items: list[list[object]]) -> None:
        agent.add_payload(wire.header("ju", 101) + b"\n" + wire.encode_lines(items))

    def headers() -> list[dict[str, object]]:
        out = []
        while (box := agent.outbox.oldest()) is not None:
            seq, payload, _ = box
            head, cols = v2.decode(gzip.decompress(payload))
            out.append({**head, "records": cols.n_collectives + cols.n_steps})
            agent.outbox.ack(seq)
        return out

    try:
        blocked = ["c", 0, "dp", 0, "allreduce", 8, T0, None, None]
        hand_over([["r", 0, 0, 1], ["m", "dp", "dp", [0]], blocked, ["w", T0, 250 * MS]])
        assert agent.seal() is not None
        assert agent.seal(vouching=True) is None  # the mark did not move: nothing to say
        hand_over([["w", T0 + 250 * MS, 250 * MS]])
        assert agent.seal() is None  # not urgent: an idle agent seals nothing
        assert agent.seal(vouching=True) is not None
        hand_over([["w", T0 + 500 * MS, 250 * MS]])
        assert agent.seal(vouching=True) is not None
        assert agent.stats.urgent_envelopes == 2
        got = headers()
        assert [h["records"] for h in got] == [1, 0, 0]
        assert [h["complete_ns"] for h in got] == [T0, T0 + 250 * MS, T0 + 500 * MS]
        assert [h["batch_seq"] for h in got] == [0, 1, 2]
        assert not agent.urgency.due(T0 + 1_100 * MS)  # no step yet: nothing is urgent
        hand_over([["s", 0, 0, T0 - 400 * MS, T0]])  # 400 ms steps
        assert agent.urgency.due(T0 + 500 * MS)
    finally:
        agent.sender.close()
