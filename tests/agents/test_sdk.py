"""The in-process SDK never blocks or raises, and hands everything to the agent once it can."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from failslow.agents import wire
from failslow.agents.sdk import Recorder


def test_records_without_any_agent_are_kept_not_raised(tmp_path: Path) -> None:
    rec = Recorder("j", socket_path=str(tmp_path / "absent.sock"), flush_interval_s=0.01)
    for i in range(1000):
        rec.record_collective(
            rank=0, comm="c", seq=i, op="allreduce", nbytes=1, start_ns=i, end_ns=i + 1
        )
    with rec.step(rank=0, step=0):
        pass
    assert rec.flush(timeout_s=0.3) is False  # nobody to hand it to
    assert rec.stats.recorded == 1001 and rec.stats.sent == 0 and rec.stats.errors == 0
    rec.close(timeout_s=0.1)


def test_queue_bound_drops_and_counts(tmp_path: Path) -> None:
    rec = Recorder("j", socket_path=str(tmp_path / "absent.sock"), max_queue=10, start=False)
    for i in range(25):
        rec.record_step(rank=0, step=i, start_ns=i, end_ns=i + 1)
    assert rec.stats.recorded == 10 and rec.stats.dropped == 15


def test_bad_arguments_never_raise(tmp_path: Path) -> None:
    rec = Recorder("j", socket_path=str(tmp_path / "absent.sock"), start=False)
    rec.register_rank("not a number")  # type: ignore[arg-type]
    rec.register_comm("c", "dp", ["x"])  # type: ignore[list-item]
    assert rec.stats.errors == 2


def test_socket_delivery_after_the_agent_appears(tmp_path: Path) -> None:
    path = str(tmp_path / "agent.sock")
    rec = Recorder("j", socket_path=path, flush_interval_s=0.01)
    rec.register_rank(3, gpu=1, world_size=8)
    for i in range(500):
        rec.record_collective(
            rank=3, comm="c", seq=i, op="allreduce", nbytes=8, start_ns=i, end_ns=i + 1
        )
    time.sleep(0.1)  # agent not there yet: everything waits in the SDK
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    server.settimeout(2)
    assert rec.flush(timeout_s=5)
    items = []
    while len(items) < 501:
        head, got = wire.decode_payload(server.recv(1 << 18))
        assert head["job"] == "j"
        items += got
    assert items[0] == ["r", 3, 1, 8]
    assert [m[3] for m in items[1:]] == list(range(500))
    rec.close()
    server.close()


def test_spool_dir_mode(tmp_path: Path) -> None:
    rec = Recorder("j", spool_dir=str(tmp_path / "spool"), flush_interval_s=0.01)
    rec.record_step(rank=0, step=1, start_ns=5, end_ns=9)
    assert rec.flush()
    files = list((tmp_path / "spool").glob("*.jsonl"))
    assert len(files) == 1
    assert wire.decode_payload(files[0].read_bytes())[1] == [["s", 0, 1, 5, 9]]
    rec.close()


def test_a_burst_is_sent_before_the_interval(tmp_path: Path) -> None:
    rec = Recorder(
        "j", spool_dir=str(tmp_path / "spool"), flush_interval_s=30.0, flush_at_records=100
    )
    time.sleep(0.05)  # the sender is asleep for the 30 s interval
    for i in range(99):
        rec.record_step(rank=0, step=i, start_ns=i, end_ns=i + 1)
    time.sleep(0.3)
    assert rec.stats.sent == 0  # below the burst size: it waits for the interval
    rec.record_step(rank=0, step=99, start_ns=99, end_ns=100)
    deadline = time.monotonic() + 5
    while rec.stats.sent < 100 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert rec.stats.sent == 100
    rec.close()


def test_no_agent_is_said_once_and_its_return_too(tmp_path: Path, caplog: object) -> None:
    import logging

    path = str(tmp_path / "agent.sock")
    caplog.set_level(logging.WARNING, logger="failslow.sdk")  # type: ignore[attr-defined]
    rec = Recorder("j", socket_path=path, flush_interval_s=0.01, warn_no_agent_after_s=0.05)
    for i in range(30):
        rec.record_step(rank=0, step=i, start_ns=i, end_ns=i + 1)
        time.sleep(0.01)
    assert rec.flush(timeout_s=0.3) is False
    assert rec.stats.agent_absent and rec.stats.agent_absent_warnings == 1
    assert rec.stats.undelivered == 30 and rec.stats.sent == 0
    warned = [r for r in caplog.records if "no node agent" in r.getMessage()]  # type: ignore[attr-defined]
    assert len(warned) == 1 and path in warned[0].getMessage()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    server.settimeout(5)
    steps = []
    while len(steps) < 30:  # the agent reads: everything kept arrives, in order
        steps += [m[2] for m in wire.decode_payload(server.recv(1 << 18))[1] if m[0] == "s"]
    assert steps == list(range(30))
    assert rec.flush(timeout_s=5)
    assert not rec.stats.agent_absent and rec.stats.undelivered == 0 and rec.stats.sent == 30
    assert any("again" in r.getMessage() for r in caplog.records)  # type: ignore[attr-defined]
    rec.close()
    server.close()
