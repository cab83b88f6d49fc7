"""Record validation: the fast path and the precise path agree on every input."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from failslow.service.ingest.envelope import parse_envelope
from failslow.service.stream.parse import (
    _parse_collective_slow,
    parse_collective,
    parse_comm,
    parse_rank,
    parse_step,
)
from failslow.service.stream.records import RecordError
from failslow.wire.ops import normalise_op

ints = st.one_of(
    st.integers(-5, 2**64),
    st.booleans(),
    st.floats(allow_nan=False),
    st.none(),
    st.text(max_size=3),
)
records = st.fixed_dictionaries(
    {},
    optional={
        "rank": ints,
        "comm": st.one_of(st.sampled_from(["dp-0", "a/b", "", "x" * 200]), ints),
        "seq": ints,
        "op": st.one_of(
            st.sampled_from(["allreduce", "AllReduce", "send", "irecv", "gather", "x"]), ints
        ),
        "bytes": ints,
        "start_ns": ints,
        "end_ns": ints,
        "peer": ints,
    },
)


def outcome(fn: Any, raw: Any) -> Any:
    try:
        return fn(raw)
    except RecordError as exc:
        return ("error", str(exc))


@settings(max_examples=2000, deadline=None)
@given(st.one_of(records, st.lists(st.integers()), st.none(), st.text()))
def test_fast_and_slow_paths_agree(raw: Any) -> None:
    assert outcome(parse_collective, raw) == outcome(_parse_collective_slow, raw)


@pytest.mark.parametrize(
    "spelling,canonical",
    [
        ("AllReduce", "allreduce"),
        ("all_gather_into_tensor", "allgather"),
        ("_reduce_scatter_base", "reducescatter"),
        ("all_to_all_single", "alltoall"),
        ("ncclBroadcast", "broadcast"),
        ("isend", "send"),
        ("irecv", "recv"),
        ("allreduce_coalesced", "allreduce"),
        ("Barrier", "barrier"),
        ("gather", None),
        ("", None),
    ],
)
def test_op_spellings(spelling: str, canonical: str | None) -> None:
    assert normalise_op(spelling) == canonical


def test_other_record_kinds() -> None:
    assert parse_step({"rank": 1, "step": 2, "start_ns": 3, "end_ns": 3}).step == 2
    with pytest.raises(RecordError, match="end_ns before start_ns"):
        parse_step({"rank": 1, "step": 2, "start_ns": 3, "end_ns": 2})
    assert parse_rank({"rank": 3, "gpu": 1, "world_size": 4}).gpu == 1
    with pytest.raises(RecordError, match="rank must be < world_size"):
        parse_rank({"rank": 4, "world_size": 4})
    assert parse_comm({"comm": "c", "kind": "tp", "ranks": [2, 1]}).ranks == (2, 1)
    for bad, msg in (
        ({"comm": "c", "kind": "xx", "ranks": [1]}, "kind"),
        ({"comm": "c", "kind": "dp", "ranks": [1, 1]}, "distinct"),
        ({"comm": "c", "kind": "p2p", "ranks": [1, 2, 3]}, "exactly two"),
    ):
        with pytest.raises(RecordError, match=msg):
            parse_comm(bad)


def test_envelope_lists_every_problem_at_once() -> None:
    from failslow.service.errors import InvalidEnvelope

    with pytest.raises(InvalidEnvelope) as info:
        parse_envelope({"job": "", "sent_ns": -1, "steps": "x"})
    assert {e["loc"] for e in info.value.errors or []} == {"job", "host", "sent_ns", "steps"}
