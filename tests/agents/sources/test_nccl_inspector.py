"""NCCL Inspector: every fixture record, the directory tailer, and v1 records the service takes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from failslow.agents.sources import nccl_inspector as ni
from tests.helpers import SHARED

FIXTURES = SHARED / "fixtures" / "telemetry"
LAYOUT = FIXTURES / "nccl-inspector-layout-4ranks.jsonl"
needs_fixtures = pytest.mark.skipif(not FIXTURES.exists(), reason=f"{FIXTURES} not present")


@needs_fixtures
def test_every_fixture_record_parses() -> None:
    recs = [ni.parse_line(line) for line in LAYOUT.read_text().splitlines()]
    assert len(recs) == 14
    dp = [r for r in recs if r.comm_name == "DP Group 0" and not r.p2p]
    assert sorted({r.sn for r in dp}) == [1405, 1406, 1407]
    # the last arriver shows the shortest duration: comm rank 3 in every collective
    for sn in (1405, 1406, 1407):
        mine = {r.comm_rank: r.exec_us for r in dp if r.sn == sn}
        assert min(mine, key=mine.__getitem__) == 3
    send = next(r for r in recs if r.p2p)
    assert (send.op, send.sn, send.peer, send.nbytes) == ("send", 12, 1, 536870912)
    docs = json.loads((FIXTURES / "nccl-inspector-readme-examples.json").read_text())
    readme = [ni.parse_obj(d) for d in docs]
    assert readme[1].kernel_start_us is not None and readme[1].kernel_stop_us is not None
    assert readme[1].kernel_stop_us - readme[1].kernel_start_us == pytest.approx(
        readme[1].exec_us, rel=0.02
    )


def _line(rank: int, sn: int, exec_us: float | int = 100, **over: object) -> str:
    doc = {
        "header": {"id": "0xabc", "comm_name": "TP Group 1", "rank": rank, "n_ranks": 2},
        "metadata": {"dump_timestamp_us": 1_000_000 + sn, "hostname": "h0", "pid": 7 + rank},
        "coll_perf": {"coll": "AllReduce", "coll_sn": sn, "coll_msg_size_bytes": 1024,
                      "coll_exec_time_us": exec_us, "unknown_key": [1, 2]},
        "new_section": {"ignored": True},
    }  # fmt: skip
    doc.update(over)
    return json.dumps(doc)


def test_tailer_follows_partial_lines_rotation_and_counts_garbage(tmp_path: Path) -> None:
    t = ni.Tailer(tmp_path)
    f = tmp_path / "h0-pid7.log"
    full = _line(0, 1) + "\n"
    f.write_text(full[:30])  # a line being written
    assert t.poll() == []
    with open(f, "a") as fh:
        fh.write(full[30:] + "garbage\n" + _line(1, 1, exec_us=99.5) + "\n{}\n")
    got = t.poll()
    assert [(r.comm_rank, r.sn, r.exec_us) for r in got] == [(0, 1, 100.0), (1, 1, 99.5)]
    assert t.rejected == {"bad_json": 1, "no_header": 1}
    assert t.poll() == []  # nothing new
    f.rename(tmp_path / "h0-pid7.log.1")  # rotated away (no longer matches *.log) ...
    f.write_text(_line(0, 5) + "\n")  # ... and a fresh file under the old name
    assert [(r.comm_rank, r.sn) for r in t.poll()] == [(0, 5)]
    (tmp_path / "h1-pid9.log").write_text(_line(1, 5) + "\n")  # a new process appears
    assert [(r.comm_rank, r.sn) for r in t.poll()] == [(1, 5)]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("[1]", "not_an_object"),
        (json.dumps({"header": {}, "metadata": {}}), "no_perf"),
        (_line(0, 1, exec_us="fast"), "bad_field"),  # type: ignore[arg-type]
        (_line(0, 1, coll_perf={"coll": ""}), "bad_field"),
    ],
)
def test_bad_lines_have_reasons(line: str, reason: str) -> None:
    with pytest.raises(ni.InspectorError) as err:
        ni.parse_line(line)
    assert err.value.reason == reason


@needs_fixtures
def test_v1_records_are_accepted_by_the_service(client: TestClient) -> None:
    recs = [ni.parse_line(line) for line in LAYOUT.read_text().splitlines()]
    ranks = ni.RankMap(by_name={"DP Group 0": (10, 11, 12, 13)})
    mapped = [m for r in recs if (m := ni.to_v1(r, ranks)) is not None]
    assert len(mapped) == 13  # the 'unknown' communicator's record cannot be placed
    comms = {c["comm"]: c for c, _ in mapped}
    assert comms["nccl-7f8c496ae9f661-allreduce"]["kind"] == "dp"
    assert comms["nccl-7f8c496ae9f661-p2p-10-11"]["ranks"] == [10, 11]
    env = {
        "job": "inspector",
        "host": "example-hostname",
        "sent_ns": 1748030380_000_000_000,
        "ranks": [{"rank": r, "gpu": r - 10, "world_size": 16} for r in (10, 11, 12, 13)],
        "comms": list(comms.values()),
        "collectives": [rec for _, rec in mapped],
    }
    r = client.post("/v1/ingest", json=env)
    assert r.status_code == 200, r.text
    assert r.json() == {"accepted": 13, "duplicates": 0, "rejected": []}


def test_unknown_communicators_are_not_guessed() -> None:
    rec = ni.parse_line(_line(1, 3))
    assert ni.to_v1(rec, ni.RankMap()) is None
    assert ni.to_v1(rec, ni.RankMap(world_size=2)) is not None  # as large as the world
    assert ni.kind_of("TENSOR_MODEL_PARALLEL_GROUP", 8, 64) == "tp"
    assert ni.kind_of("default_pg", 64, 64) == "world"


def test_the_agent_delivers_inspector_dumps_once_each(tmp_path: Path, db_url: str) -> None:
    from failslow.agents.agent import NodeAgent
    from failslow.service.settings import Settings
    from tests.live import live_service, wait_for

    dumps = tmp_path / "inspector"
    dumps.mkdir()
    log = dumps / "h0-pid7.log"
    lines = [_line(r, sn, exec_us=100 if r == 0 else 60) for sn in (1, 2, 3) for r in (0, 1)]
    log.write_text("\n".join(lines) + "\n" + _line(0, 3) + "\n")  # sn 3 dumped twice by rank 0
    source = ni.InspectorSource(dumps, ni.RankMap(by_name={"TP Group 1": (4, 5)}))
    with live_service(Settings(database_url=db_url)) as url:
        agent = NodeAgent(
            service=url,
            job="insp",
            host="h0",
            state_dir=str(tmp_path / "state"),
            flush_interval_s=0.1,
            fsync=False,
            inspector=source,
        )
        agent.start()
        import httpx

        def accepted() -> int:
            r = httpx.get(f"{url}/v1/jobs/insp")
            return sum(h["accepted"] for h in r.json()["ingest"].values()) if r.is_success else 0

        try:
            assert wait_for(lambda: accepted() == 6, timeout=30), (accepted(), agent.stats)
            with open(log, "a") as fh:  # more arrives later
                fh.write(_line(0, 4) + "\n" + _line(1, 4) + "\n")
            assert wait_for(lambda: accepted() == 8, timeout=30), (accepted(), agent.stats)
            ranks = httpx.get(f"{url}/v1/jobs/insp/ranks").json()
            assert [(r["rank"], r["host"]) for r in ranks] == [(4, "h0"), (5, "h0")]
        finally:
            agent.stop()
    assert source.records == 8 and source.unmapped == 0
    assert agent.stats.records_duplicate == 0 and agent.stats.records_rejected == 0
    assert sorted(agent.ranks) == [4, 5]  # announced on this host
