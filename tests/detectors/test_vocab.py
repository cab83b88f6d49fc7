"""The vocabulary: the spec's names, and subjects that read back as they were stored."""

from __future__ import annotations

import pytest

from failslow.detectors.types import KIND_INDEX, KINDS, P2P
from failslow.detectors.vocab import CommKind, IncidentKind, Op, Subject, SubjectKind


def test_the_spec_names() -> None:
    assert {k.value for k in CommKind} == {"dp", "tp", "pp", "ep", "cp", "world", "p2p", "other"}
    assert {o.value for o in Op} == {
        "allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall", "barrier",
        "send", "recv",
    }  # fmt: skip
    assert {k.value for k in IncidentKind} == {
        "slow_gpu", "slow_node", "slow_link", "hang", "job_slowdown",
    }  # fmt: skip
    assert KINDS[P2P] == "p2p" and KIND_INDEX["dp"] == 0  # the frame arrays' column order


@pytest.mark.parametrize(
    "subject,text",
    [
        (Subject.job(), "job"),
        (Subject.slot(7), "slot:7"),
        (Subject.ranks([3, 11]), "rank:3,11"),
        (Subject.host("node-3"), "host:node-3"),
        (Subject.link((("a", "b"), ("c", "d"))), "link:a|b,c|d"),
    ],
)
def test_subjects_round_trip(subject: Subject, text: str) -> None:
    assert str(subject) == text
    assert Subject.parse(text) == subject
    assert hash(Subject.parse(text)) == hash(subject)


def test_subject_parts() -> None:
    assert Subject.link((("a", "b"), ("c", "d"))).pairs == (("a", "b"), ("c", "d"))
    assert Subject.host("x").pairs == ()
    assert Subject.slot(4).slot_index == 4
    with pytest.raises(ValueError):
        Subject.host("x").slot_index  # noqa: B018
    for bad in ("", "host", "host:", "nic:x"):
        with pytest.raises(ValueError):
            Subject.parse(bad)
    assert Subject.parse("link:a|b").kind is SubjectKind.LINK
