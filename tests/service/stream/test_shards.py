"""A job's join and frames split over shard processes (stream/shards) give what one process
gives: the same closed frames (every array), join counts, incomplete collectives in the same
order, through a snapshot and a split in the middle of the job; a shard that dies is reported
as such."""

from __future__ import annotations

import dataclasses
import os
import pickle
import signal
import time
from typing import Any

import numpy as np
import pytest

from failslow.detectors.types import Frame
from failslow.service.stream import v2apply
from failslow.service.stream.settings import StateSettings
from failslow.service.stream.shards.pool import ShardFailed, Shards
from failslow.service.stream.state import ApplyResult, JobState
from failslow.wire import v2
from tests.service.stream.test_v2apply import (
    Envelope,
    _answer,
    _job,
    _same,
    _state,
    _traffic,
)

SHARDED = {"shards": 2, "shard_min_ranks": 1}


def _sharded(hosts: Any, jit: bool, **settings: Any) -> JobState:
    state = _state(hosts, jit)
    state.settings = StateSettings(**(SHARDED | settings))
    state.scale_limits()
    return state


def _fields(f: Frame) -> dict[str, Any]:
    return {x.name: getattr(f, x.name) for x in dataclasses.fields(f)}


def _run(state: JobState, traffic: list[Envelope], step_ns: int, every: int) -> list[Any]:
    """Apply in groups, a detection pass's part after every ``every`` envelopes, then flush."""
    out: list[Any] = []
    for i in range(0, len(traffic), every):
        answers = v2apply.apply_v2_many(state, traffic[i : i + every])
        out.append([_answer(a) for a in answers])
        out.append([_fields(f) for f in state.close_frames()])
    state.clock.restore(state.watermark_ns + 10 * step_ns)
    out.append([_fields(f) for f in state.close_frames(flush=True)])
    return out


def _close(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Frames agree: sums over shards in another order differ in the last bits only."""
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], np.ndarray) and a[k].dtype.kind == "f":
            np.testing.assert_allclose(a[k], b[k], rtol=1e-12, atol=1e-15, equal_nan=True)
        else:
            _same(a[k], b[k])


def _compare(one: list[Any], other: list[Any]) -> int:
    """Same answers; the same frames, the sharded job's each one pass later at most (a pass
    takes the shards' answers to the previous one)."""
    assert len(one) == len(other)
    when: list[dict[int, int]] = [{}, {}]
    frames: list[list[dict[str, Any]]] = [[], []]
    for i, (x, y) in enumerate(zip(one, other, strict=True)):
        if i % 2 == 0 and i < len(one) - 1:
            _same(x, y)  # answers
            continue
        for k, part in enumerate((x, y)):
            for f in part:
                when[k][f["index"]] = i // 2
                frames[k].append(f)
    assert [f["index"] for f in frames[0]] == [f["index"] for f in frames[1]]
    for a, b in zip(*frames, strict=True):
        _close(a, b)
    assert all(0 <= when[1][i] - when[0][i] <= 1 for i in when[0])
    return len(frames[0])


@pytest.mark.parametrize("jit", [True, False], ids=["compiled", "numpy"])
@pytest.mark.parametrize("shards", [1, 2, 3])
def test_sharded_equals_one_process(shards: int, jit: bool) -> None:
    rng = np.random.default_rng(shards)
    job, hosts = _job()
    traffic = _traffic(job, hosts, rng)
    one = _state(hosts, jit)
    sharded = _sharded(hosts, jit, shards=shards)
    try:
        assert sharded.shards is not None and sharded.shards.count == shards
        a = _run(one, traffic, job.step_ns, 7)
        b = _run(sharded, traffic, job.step_ns, 7)
        assert _compare(a, b) >= 3
        assert any(f["collectives"] for part in a[1::2] for f in part)
        assert one.join_stats() == sharded.join_stats()
        assert one.dropped_contributions() == sharded.dropped_contributions()
        assert one.frames.last_progress_ns == sharded.frames.last_progress_ns
    finally:
        sharded.close()


def _incomplete(traffic: list[Envelope]) -> list[Envelope]:
    """The traffic without host 3's envelopes after its first, in which its calls are still in
    flight (no end): its collectives stay open, and a hang detector would look at them."""
    seen = False
    out = []
    for e in traffic:
        if e[0]["host"] == "node-000003":
            if seen:
                continue
            seen = True
            header, cols = v2.decode(e[1])
            c = {k: v.copy() for k, v in cols.collectives.items()}
            c["end_ns"][:] = v2.NO_END
            body = v2.encode(header, c, dict(cols.steps))
            e = (header, body, v2.decode_header(body)[1])
        out.append(e)
    return out


def test_pending_collectives_agree_in_arrival_order() -> None:
    job, hosts = _job()
    traffic = _incomplete(_traffic(job, hosts, np.random.default_rng(7)))
    one, sharded = _state(hosts, True), _sharded(hosts, True)
    try:
        for s in (one, sharded):
            v2apply.apply_v2_many(s, traffic)
            s.drain_ready()
            s.close_frames()
        assert one.join_stats() == sharded.join_stats()
        assert sharded.join_stats().pending_groups > 6
        # the hang detector's input comes with a pass's answers (asked at the pass before)
        now = sharded.watermark_ns + 1
        for _ in range(2):
            sharded.close_frames(blocked_before_ns=now)
        a, b = one.blocked_groups(now), sharded.blocked_groups(now)
        assert len(a) > 6
        assert [(g.comm, g.seq, g.arrival) for g in a] == [(g.comm, g.seq, g.arrival) for g in b]
        for x, y in zip(a, b, strict=True):
            _same(x.positions, y.positions)
            _same(x.ends, y.ends)
        assert one.abandon() == sharded.abandon() > 0
        assert sharded.join_stats().pending_groups == 0
    finally:
        sharded.close()


def test_split_in_the_middle_and_a_snapshot_give_the_same_frames() -> None:
    """A job split after half its traffic (what was placed stays with the owner, what is pending
    moves to the shards), then pickled as a snapshot is and resumed in new shard processes."""
    job, hosts = _job()
    traffic = _traffic(job, hosts, np.random.default_rng(5))
    half = len(traffic) // 2
    one, other = _state(hosts, True), _state(hosts, True)
    try:
        a = _run(one, traffic[:half], job.step_ns, 5)[:-1]
        b = _run(other, traffic[:half], job.step_ns, 5)[:-1]
        assert other.join_stats().pending_groups > 0
        other.shards = Shards("j", 2, StateSettings(**SHARDED))
        other.shards.split(other.assembly, other.topology)
        assert other.joiner.pending_groups == 0
        assert other.join_stats().pending_groups == one.join_stats().pending_groups
        # a snapshot pickles the state's attributes (replica/snapshot.py): the shards' parts too
        blob = pickle.dumps({k: v for k, v in other.__dict__.items() if k != "lock"})
        other.close()
        resumed = JobState.__new__(JobState)
        resumed.__dict__.update(pickle.loads(blob))  # noqa: S301 - our own
        resumed.lock = other.lock
        assert resumed.shards is not None and resumed.shards.procs == []
        a += _run(one, traffic[half:], job.step_ns, 5)
        b += _run(resumed, traffic[half:], job.step_ns, 5)
        assert _compare(a, b) >= 3
        assert one.join_stats() == resumed.join_stats()
    finally:
        other.close()
        if "resumed" in locals():
            resumed.close()


def test_a_shard_that_died_is_started_again_and_the_job_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A shard killed with -9: the next request finds it gone, says so (by job and shard) and
    starts the job's shards again, empty; every later envelope is accepted and frames keep
    closing (the dead shard's pending collectives and its part of the open frames are lost)."""
    job, hosts = _job()
    traffic = _traffic(job, hosts, np.random.default_rng(1))
    state = _sharded(hosts, True)
    try:
        v2apply.apply_v2_many(state, traffic[:20])
        state.close_frames()
        assert state.shards is not None
        old = state.shards.procs[1]
        os.kill(old.pid, signal.SIGKILL)  # type: ignore[arg-type]
        old.join(5)
        with caplog.at_level("ERROR"):
            answers = v2apply.apply_v2_many(state, traffic[20:])
            closed = state.close_frames()
            state.clock.restore(state.watermark_ns + 10 * job.step_ns)
            closed += state.close_frames(flush=True)
        assert "job j: shard process 1 exited (code -9)" in caplog.text
        assert state.shards.restarts == 1 and old not in state.shards.procs
        assert all(p.is_alive() for p in state.shards.procs)
        assert sum(a.accepted for a in answers if isinstance(a, ApplyResult)) > 1000
        assert closed and any(f.collectives for f in closed)
        assert state.join_stats().pending_groups >= 0  # the new shards answer
    finally:
        state.close()
    with pytest.raises(ShardFailed):
        raise ShardFailed("kept importable")


@pytest.mark.parametrize("call", ["limits", "sync"])
def test_a_shard_found_dead_by_new_limits_or_comms_is_started_again(call: str) -> None:
    """The job grows while a shard is dead: new bounds (or new comms) for the shards restart
    them, as every other request to them does (CI: an ingest answered 500 with ShardFailed from
    ``limits``, called while the envelope was applied)."""
    job, hosts = _job()
    traffic = _traffic(job, hosts, np.random.default_rng(1))
    state = _sharded(hosts, True)
    try:
        v2apply.apply_v2_many(state, traffic[:20])
        assert state.shards is not None
        old = state.shards.procs[0]
        os.kill(old.pid, signal.SIGKILL)  # type: ignore[arg-type]
        old.join(5)
        if call == "limits":
            state.shards.limits(state.limits)
        else:
            state.shards.sent_comms -= 1  # one comm not sent yet
            state.shards.sync(state.topology)
        assert state.shards.restarts == 1 and old not in state.shards.procs
        assert all(p.is_alive() for p in state.shards.procs)
        answers = v2apply.apply_v2_many(state, traffic[20:])
        assert sum(a.accepted for a in answers if isinstance(a, ApplyResult)) > 1000
    finally:
        state.close()


def test_small_jobs_stay_in_one_process() -> None:
    job, hosts = _job()
    state = _state(hosts, True)
    state.settings = StateSettings(shards=2, shard_min_ranks=job.ranks + 1)
    state.scale_limits()
    assert state.shards is None


def test_frames_closed_after_the_last_records_come_at_the_next_pass() -> None:
    """No more records after a step: the next pass still brings the shards' parts of the frames
    the previous pass closed, and the job has no work once they are in (no pass for ever)."""
    job, hosts = _job()
    traffic = _traffic(job, hosts, np.random.default_rng(3))
    one, sharded = _state(hosts, True), _sharded(hosts, True)
    try:
        for s in (one, sharded):
            v2apply.apply_v2_many(s, traffic)
            s.clock.restore(s.watermark_ns + 10 * job.step_ns)
        closed = one.close_frames()
        assert closed and sharded.close_frames() == []  # asked, not answered yet
        assert sharded.waiting()
        later = sharded.close_frames()  # nothing new came: the answers are read all the same
        assert [f.index for f in later] == [f.index for f in closed]
        for a, b in zip(closed, later, strict=True):
            _close(_fields(a), _fields(b))
        sharded.abandon()
        one.abandon()
        assert one.close_frames() == []
        for _ in range(2):  # the answers in flight, then nothing new to ask
            assert sharded.close_frames() == []
        assert sharded.shards is not None and not sharded.waiting()
    finally:
        sharded.close()


def _passes(state: JobState, traffic: list[Envelope], every: int) -> list[int]:
    indices = []
    for i in range(0, len(traffic), every):
        v2apply.apply_v2_many(state, traffic[i : i + every])
        indices += [f.index for f in state.close_frames()]
    return indices


def test_a_shard_killed_mid_step_never_has_a_step_analysed_twice() -> None:
    """Issue 31, case 8: a shard killed with SIGKILL in the middle of a step gave 33 frames for
    30 steps (the new shards closed steps again). Frames are closed once, in order."""
    job, hosts = _job()
    traffic = _traffic(job, hosts, np.random.default_rng(2))
    state = _sharded(hosts, True)
    try:
        indices = _passes(state, traffic[:13], 3)  # in the middle of a step (before: 5 for 4)
        assert state.shards is not None
        os.kill(state.shards.procs[0].pid, signal.SIGKILL)  # type: ignore[arg-type]
        indices += _passes(state, traffic[13:], 3)
        state.clock.restore(state.watermark_ns + 10 * job.step_ns)
        indices += [f.index for f in state.close_frames(flush=True)]
        assert state.shards.restarts == 1
        assert indices == sorted(set(indices)), indices
    finally:
        state.close()


def test_a_stopped_shard_holds_the_job_up_for_its_timeout_at_most() -> None:
    """Issue 31, case 8: a shard stopped with SIGSTOP held the job's lock, and every request
    with it, for over a minute (pipe, ring and answers had no timeout). Now it fails after
    ``shard_timeout_s`` and the job's shards start again."""
    job, hosts = _job()
    traffic = _traffic(job, hosts, np.random.default_rng(4))
    state = _sharded(hosts, True, shard_timeout_s=1.0)
    try:
        _passes(state, traffic[:10], 5)
        assert state.shards is not None
        stopped = state.shards.procs[1]
        os.kill(stopped.pid, signal.SIGSTOP)  # type: ignore[arg-type]
        started = time.monotonic()
        answers = v2apply.apply_v2_many(state, traffic[10:20])
        state.close_frames()
        state.close_frames()  # the answers to the pass asked above
        took = time.monotonic() - started
        assert state.shards.restarts == 1 and stopped not in state.shards.procs
        assert took < 1.0 * 3 + 3, took  # one timeout (and a restart), not a hang
        assert sum(a.accepted for a in answers if isinstance(a, ApplyResult)) > 100
        deadline = time.monotonic() + 10
        while stopped.is_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not stopped.is_alive()  # killed, though stopped
    finally:
        state.close()


def test_a_sharded_job_leaves_memory_without_waiting_for_its_shards() -> None:
    """Issue 31, case 8: evicting 4-6 sharded jobs stalled /healthz 3-6 s (the shards were
    stopped and joined on the event loop). Closing now hands them to a thread of their own."""
    job, hosts = _job()
    traffic = _traffic(job, hosts, np.random.default_rng(5))
    state = _sharded(hosts, True)
    _passes(state, traffic[:6], 3)
    assert state.shards is not None
    procs = list(state.shards.procs)
    for p in procs:
        os.kill(p.pid, signal.SIGSTOP)  # type: ignore[arg-type]
    started = time.monotonic()
    state.close()
    assert time.monotonic() - started < 0.5
    deadline = time.monotonic() + 15  # the thread reaps them (joining here too would race it)
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(p.is_alive() for p in procs)
