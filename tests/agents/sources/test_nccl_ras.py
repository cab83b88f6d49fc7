"""NCCL RAS: the JSON status, monitor events and the text report from ../shared, and garbage."""

from __future__ import annotations

import json

import pytest

from failslow.agents.sources import nccl_ras as ras
from tests.helpers import SHARED

FIXTURES = SHARED / "fixtures" / "telemetry"
needs_fixtures = pytest.mark.skipif(not FIXTURES.exists(), reason=f"{FIXTURES} not present")


@needs_fixtures
def test_json_status_names_the_unresponsive_rank() -> None:
    status = ras.parse_status((FIXTURES / "nccl-ras-status.json").read_bytes())
    (comm,) = status.comms
    assert comm.hash == "0xae94423cfbb2ef4a" and comm.size == 2
    assert [r.rank for r in comm.ranks] == [0] and comm.ranks[0].collectives == 0
    assert [(r.rank, r.host, r.pid, r.unresponsive, r.dead) for r in comm.missing] == [
        (1, "172.16.64.245", 1524345, True, False)
    ]
    assert status.suspects() == {1: "unresponsive"}


@needs_fixtures
def test_monitor_event() -> None:
    ev = ras.parse_event((FIXTURES / "nccl-ras-monitor-event.json").read_bytes())
    assert (ev.event, ev.host, ev.pid, ev.cuda_devs) == (
        "PEER_DEAD",
        "172.16.64.245",
        1524345,
        (1,),
    )


@needs_fixtures
def test_text_report_findings() -> None:
    found = ras.parse_text((FIXTURES / "nccl-ras-text-status.txt").read_text())
    mismatch = found[0]
    assert (mismatch.kind, mismatch.comm) == ("MISMATCH", "#0-0 (27a079b828ff1a75)")
    assert mismatch.groups == (
        ("26 ranks have launched up to operation 6650", ()),
        ("6 ranks have launched up to operation 6649", (0, 2, 3, 4, 5, 7)),
    )
    incomplete = [f for f in found if f.kind == "INCOMPLETE" and f.comm]
    assert incomplete and incomplete[0].missing_ranks == (21,)
    dead = next(f for f in found if f.kind == "DEAD")
    assert dead.processes == ((3487984, "172.16.64.213", 5),)
    assert {f.kind for f in found} == {"MISMATCH", "INCOMPLETE", "DEAD", "TIMEOUT"}


def test_lagging_ranks_from_collective_counts() -> None:
    doc = {
        "communicators": [
            {
                "hash": "0x1",
                "size": 3,
                "ranks": [
                    {"rank": r, "host": "h", "collective_counts": {"AllReduce": n, "new_op": 1}}
                    for r, n in ((0, 10), (1, 9), (2, 10))
                ],
                "missing_ranks": [],
                "unknown_key": {"ignored": True},
            }
        ]
    }
    status = ras.parse_status(json.dumps(doc))
    assert status.comms[0].lagging() == (1,)
    assert status.suspects() == {1: "lagging"}


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ("{", "bad_json"),
        ("[]", "not_a_status"),
        ('{"communicators": [1]}', "bad_field"),
        ('{"communicators": [{"ranks": [{"rank": "x"}]}]}', "bad_field"),
    ],
)
def test_garbage_status(data: str, reason: str) -> None:
    with pytest.raises(ras.RasError) as err:
        ras.parse_status(data)
    assert err.value.reason == reason


def test_garbage_event_and_text() -> None:
    with pytest.raises(ras.RasError) as err:
        ras.parse_event('{"no": "event"}')
    assert err.value.reason == "not_an_event"
    assert ras.parse_text("random\nlines\n  indented but no heading\n") == []
    with pytest.raises(ras.RasError):
        ras.parse_text(b"bytes")  # type: ignore[arg-type]
