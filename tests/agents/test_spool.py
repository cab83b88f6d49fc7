"""The agent's durable outbox."""

from __future__ import annotations

from pathlib import Path

from failslow.agents.spool import AgentState, Outbox


def test_fifo_and_ack(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o", fsync=False)
    for seq in (3, 1, 2):
        box.put(seq, f"p{seq}".encode(), records=seq * 10)
    assert box.oldest() == (1, b"p1", 10)
    box.ack(1)
    assert box.oldest() == (2, b"p2", 20)
    assert len(box) == 2 and box.max_seq() == 3


def test_survives_restart_and_drops_half_written_files(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o", fsync=False)
    box.put(5, b"five", records=4)
    (tmp_path / "o" / "000000000006-3.tmp").write_bytes(b"half")
    again = Outbox(tmp_path / "o", fsync=False)
    assert again.oldest() == (5, b"five", 4)
    assert not list((tmp_path / "o").glob("*.tmp"))


def test_size_bound_drops_oldest_and_counts(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o", max_bytes=25, fsync=False)
    for seq in range(5):
        box.put(seq, b"x" * 10, records=7)
    assert len(box) == 2 and box.oldest()[0] == 3  # type: ignore[index]
    assert (box.dropped_envelopes, box.dropped_records) == (3, 21)


def test_bury_keeps_the_envelope_and_why(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o", fsync=False)
    box.put(1, b"bad", records=1)
    box.bury(1, "HTTP 400: nope")
    assert box.oldest() is None
    dead = list((tmp_path / "o" / "dead").iterdir())
    assert sorted(p.suffix for p in dead) == [".gz", ".why"]


def test_agent_state_roundtrip(tmp_path: Path) -> None:
    st = AgentState(tmp_path / "a.json")
    st.data["next_seq"] = 4
    st.save()
    assert AgentState(tmp_path / "a.json").data == {"next_seq": 4}
    (tmp_path / "b.json").write_text("{broken")
    assert AgentState(tmp_path / "b.json").data == {}
