"""Flight Recorder dumps: the real 16-rank dumps in ../shared, a safe unpickler, garbage."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest

from failslow.agents.sources import flight_recorder as fr
from tests.helpers import SHARED

FIXTURES = SHARED / "fixtures" / "telemetry"
DUMPS = FIXTURES / "flight-recorder-pickle"
needs_fixtures = pytest.mark.skipif(not DUMPS.exists(), reason=f"{DUMPS} not present")


@pytest.fixture(scope="module")
def dumps() -> dict[int, fr.Dump]:
    loaded = [fr.load(p) for p in sorted(DUMPS.glob("_dump_*"))]
    return {d.rank: d for d in loaded if d.rank is not None}


@needs_fixtures
def test_the_stuck_collective_matches_the_reference_analyzer(dumps: dict[int, fr.Dump]) -> None:
    assert sorted(dumps) == list(range(16))
    ref = (DUMPS / "reference_output__gpu_error_1st_reference.txt").read_text().splitlines()
    cells = [c.strip() for c in ref[1].split("|")]  # PGID | desc | op | size | dtype | missing
    stuck = fr.stuck_collectives(dumps)
    first = stuck[0]
    assert first.group == cells[0]
    assert first.desc == cells[1].split(",")[0]
    assert first.op == cells[2]
    assert "x".join(str(x) for x in first.sizes[0]) == cells[3]
    assert first.dtypes[0] == cells[4]
    assert list(first.missing) == [int(r) for r in cells[5].split(",")]
    # the fault log injected GPU errors on ranks 12 and 14; 12 is the one the others wait for
    assert "Fault ranks: [12, 14]" in (DUMPS / "fault_injection.log").read_text()
    assert all(s.missing == (12,) for s in stuck)  # every group that disagrees waits for 12


@needs_fixtures
def test_json_dumps_read_the_same_as_the_pickles(dumps: dict[int, fr.Dump]) -> None:
    for rank in (0, 12):
        j = fr.load(FIXTURES / f"flight-recorder-rank{rank}.json", rank=rank)
        assert j.entries == dumps[rank].entries
        assert j.groups == dumps[rank].groups
        assert j.status == dumps[rank].status
    status = fr.last_collectives(dumps.values())[12]
    assert status["0"].last_enqueued >= status["0"].last_completed >= -1


class Boom:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("echo pwned > /tmp/failslow-pwned",))


def test_a_pickle_with_a_class_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    evil = pickle.dumps({"entries": [Boom()]})
    with pytest.raises(fr.DumpError) as err:
        fr.parse(evil)
    assert err.value.reason == "bad_pickle" and "refused" in str(err.value)
    assert not Path("/tmp/failslow-pwned").exists()


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty"),
        (b"\x80\x04\x95garbage", "bad_pickle"),
        (b"{not json", "bad_json"),
        (b"[1, 2, 3]", "not_a_dump"),
        (json.dumps({"entries": "x"}).encode(), "bad_field"),
        (json.dumps({"entries": [{"process_group": ["1", "dp"]}]}).encode(), "bad_field"),
        (
            json.dumps({"entries": [], "pg_config": {"1": {"ranks": "[0, x]"}}}).encode(),
            "bad_field",
        ),
    ],
)
def test_garbage_is_a_counted_reason_never_a_crash(data: bytes, reason: str) -> None:
    with pytest.raises(fr.DumpError) as err:
        fr.parse(data)
    assert err.value.reason == reason


def test_missing_file_is_a_reason(tmp_path: Path) -> None:
    with pytest.raises(fr.DumpError) as err:
        fr.load(tmp_path / "nope_3")
    assert err.value.reason == "unreadable"


def test_groups_that_agree_are_not_stuck() -> None:
    def dump(rank: int, last: int) -> fr.Dump:
        e = [
            fr.Entry(
                "7", "dp", s, False, "nccl:all_reduce", "completed", 10 * s, None, None,
                ((4,),), ("Float",),
            )
            for s in range(last - 2, last + 1)
        ]  # fmt: skip
        return fr.Dump(rank, "2.9", {"7": ("dp", (0, 1))}, {}, tuple(e))

    assert fr.stuck_collectives({0: dump(0, 5), 1: dump(1, 5)}) == []
    stuck = fr.stuck_collectives({0: dump(0, 5), 1: dump(1, 6)})
    assert [(s.group, s.seq, s.missing, s.present) for s in stuck] == [("7", 6, (0,), (1,))]
