"""The v2 codec: what is encoded decodes to the same columns; anything else is a FormatError."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from failslow.wire import topology, v2

HEADER = {"job": "j", "host": "h", "sent_ns": 5, "agent": "a", "batch_seq": 0, "topology": "x"}


def body(k: int = 3, s: int = 2) -> bytes:
    cols = {
        "rank": range(k), "comm": [0] * k, "seq": range(k), "op": [0] * k, "bytes": [8] * k,
        "start_ns": range(10, 10 + k), "end_ns": [v2.NO_END] + list(range(20, 19 + k)),
        "peer": [v2.NO_PEER] * k,
    }  # fmt: skip
    steps = {"rank": range(s), "step": [3] * s, "start_ns": [1] * s, "end_ns": [2] * s}
    return v2.encode(HEADER, cols, steps)


@given(k=st.integers(0, 40), s=st.integers(0, 9))
@settings(max_examples=40, deadline=None)
def test_round_trip(k: int, s: int) -> None:
    header, cols = v2.decode(body(k, s))
    assert header == {**HEADER, "collectives": k, "steps": s}
    assert cols.n_collectives == k and cols.n_steps == s
    assert cols.collectives["seq"].tolist() == list(range(k))
    assert cols.collectives["end_ns"][:1].tolist() == ([v2.NO_END] if k else [])
    assert cols.steps["step"].tolist() == [3] * s
    assert len(body(k, s)) % 8 == 0


def test_bytes_per_collective() -> None:
    """45 bytes of columns per collective (plus the padding of a few columns)."""
    assert len(body(1000, 0)) - len(body(0, 0)) == 1000 * 45


@pytest.mark.parametrize(
    "bad,why",
    [
        (b"", "magic"),
        (b"FSL1" + bytes(8), "magic"),
        (b"FSL2" + struct.pack("<I", 10**6) + bytes(16), "header length"),
        (b"FSL2" + struct.pack("<I", 3) + b"abc" + bytes(5), "JSON"),
        (b"FSL2" + struct.pack("<I", 2) + b"[]" + bytes(6), "object"),
        (v2.encode(HEADER, {}, {}) + bytes(8), "after the last column"),
        (body(3, 2)[:-8], "ends inside"),
    ],
)
def test_malformed_bodies(bad: bytes, why: str) -> None:
    with pytest.raises(v2.FormatError, match=why):
        v2.decode(bad)


def test_counts_must_be_counts() -> None:
    raw = b'{"collectives": -1, "steps": 0}'
    with pytest.raises(v2.FormatError, match="counts"):
        v2.decode(b"FSL2" + struct.pack("<I", len(raw)) + raw + bytes((-len(raw)) % 8))


def test_columns_of_the_wrong_length_are_refused() -> None:
    with pytest.raises(ValueError, match="column"):
        v2.encode(HEADER, {"rank": [1, 2], "comm": [0]}, {})


def test_digest_is_canonical() -> None:
    ranks = [{"rank": 1, "gpu": 1, "world_size": 4}, {"rank": 0, "gpu": 0, "world_size": 4}]
    comms = [{"comm": "dp", "kind": "dp", "ranks": [0, 1, 2, 3]}]
    d = topology.digest(ranks, comms)
    assert d == topology.digest(list(reversed(ranks)), comms)  # rank order does not matter
    assert d != topology.digest(ranks, [{**comms[0], "ranks": [1, 0, 2, 3]}])  # ring order does
    assert len(d) == 16 and int(d, 16) >= 0
