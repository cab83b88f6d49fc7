"""A full disk (a real one: a 1 MiB tmpfs) neither kills the agent nor loses a record uncounted:
envelopes wait in memory, go to disk when space returns, and are all delivered (issue 17)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from failslow.agents.agent import NodeAgent
from failslow.service.settings import Settings
from tests.infra.disk import fill, small_tmpfs
from tests.live import free_port, live_service, wait_for

JOB = "disk-job"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "fs") as where:
        if isinstance(where, str):
            pytest.skip(where)
        yield where


def batch(agent: NodeAgent, first: int, n: int) -> None:
    agent.add_items(
        [["r", 0, 0, 1], ["m", "w", "world", [0]]]
        + [["s", 0, i, 10 * i, 10 * i + 5] for i in range(first, first + n)]
    )


def test_a_full_disk_keeps_envelopes_in_memory_then_delivers_them(
    small_disk: Path, tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nobody listens yet
    agent = NodeAgent(service=url, job=JOB, host="h0", state_dir=str(small_disk / "state"),
                      fsync=True, backoff_cap_s=0.2)  # fmt: skip
    try:
        batch(agent, 0, 50)
        assert agent.seal() is not None and len(agent.outbox) == 1
        filler = fill(small_disk)
        for k in range(1, 6):  # the disk is full: sealing goes on, into memory
            batch(agent, 50 * k, 50)
            assert agent.seal() is not None
        agent.write_stats()  # does not raise either
        assert agent.outbox.in_memory() == 5 and agent.outbox.disk_errors >= 1
        assert agent.stats.records_sealed == agent.stats.records_in == 300
        assert agent.stats.dropped_records == 0
        filler.unlink()  # space returns
        assert agent.outbox.spill() == 5 and agent.outbox.in_memory() == 0
        assert len(list((small_disk / "state" / "outbox").glob("*.json.gz"))) == 6
        settings = Settings(database_url=f"sqlite:///{tmp_path}/f.db")
        with live_service(settings, port=int(url.rsplit(":", 1)[1])):
            agent.start()
            assert wait_for(lambda: len(agent.outbox) == 0, timeout=30)
            assert agent.stats.records_accepted == 300
    finally:
        agent.stop(drain_timeout_s=0)


def test_memory_is_bounded_and_what_it_drops_is_counted(small_disk: Path) -> None:
    agent = NodeAgent(service="http://127.0.0.1:9", job=JOB, host="h0",
                      state_dir=str(small_disk / "state"), fsync=False)  # fmt: skip
    agent.outbox.max_memory_bytes = 1  # room for one envelope at a time
    try:
        fill(small_disk)
        for k in range(4):
            batch(agent, 50 * k, 50)
            agent.seal()
        agent._refresh_stats()
        assert agent.outbox.in_memory() == 1 and agent.outbox.dropped_envelopes == 3
        assert agent.stats.dropped_records == 150 and agent.stats.records_sealed == 200
    finally:
        agent.sender.close()
