"""The pieces under the replicas (docs/replicas.md): snapshots, fencing, the registry's holding."""

from __future__ import annotations

import pickle
import zlib
from pathlib import Path

import pytest

from failslow.harness.simulator import Layout, Scenario
from failslow.service.db import make_engine, make_sessionmaker, session_scope, upgrade
from failslow.service.detection.engine import JobRuntime
from failslow.service.detection.history import HistoryAccumulator
from failslow.service.jobs.service import take_uncommitted
from failslow.service.replica import snapshot, store
from failslow.service.settings import StateSettings
from failslow.service.stream.registry import JobRegistry
from failslow.service.stream.state import JobState
from tests import simrun


@pytest.fixture(scope="module")
def ran() -> simrun.Run:
    return simrun.run(Scenario(layout=Layout(tp=2, pp=1, dp=4, gpus_per_host=2), steps=30, seed=2))


def test_a_snapshot_restores_the_core_and_the_detectors(ran: simrun.Run) -> None:
    state = ran.state
    rt = JobRuntime(pipeline=ran.pipeline, history=HistoryAccumulator(job=state.job, every=10))
    rt.open[("slow_gpu", "slot:3")] = "inc_x"  # type: ignore[index]
    with state.lock:
        take_uncommitted(state)
        blob = snapshot.dumps(state, rt)
    back, rt2 = snapshot.loads(blob, StateSettings())
    assert rt2 is not None
    assert back.job == state.job and back.watermark_ns == state.watermark_ns > 0
    assert back.topology.world_size == state.topology.world_size == 8
    assert sorted(back.topology.ranks) == sorted(state.topology.ranks)
    assert back.streams == state.streams
    assert back.lock is not state.lock and back.lock.acquire(blocking=False)
    assert back.deltas == {} and back.persisted and back.committing == 0
    assert rt2.pipeline.count == ran.pipeline.count > 20
    assert rt2.pipeline.job_view() == ran.pipeline.job_view()
    assert rt2.open == rt.open and rt2.shape is None  # the shape is rebuilt on the next pass


def test_a_snapshot_of_another_version_or_damaged_is_not_read(ran: simrun.Run) -> None:
    with ran.state.lock:
        blob = snapshot.dumps(ran.state, None)
    body = pickle.loads(zlib.decompress(blob))
    body["version"] = "0.0.1"
    other = zlib.compress(pickle.dumps(body))
    with pytest.raises(snapshot.Incompatible, match="0.0.1"):
        snapshot.loads(other, StateSettings())
    with pytest.raises(snapshot.Incompatible):
        snapshot.loads(blob[:-10], StateSettings())


def _job_commit(job: str, seq: int, *, snap: bool = True) -> store.JobCommit:
    state = JobState(job, StateSettings())
    with state.lock:
        u = take_uncommitted(state)
        body = snapshot.dumps(state, None) if snap else None
    return store.JobCommit(u, 0, seq, body)


def test_a_newer_epoch_fences_the_old_owner_out(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/db.sqlite")
    upgrade(engine)
    sessions = make_sessionmaker(engine)
    with session_scope(sessions) as s:
        assert store.claim(s, partition=0, owner="a", epoch=5) == 0
    with session_scope(sessions) as s:
        store.commit(s, partition=0, epoch=5, position=10, jobs=[_job_commit("j", 10)])
    with session_scope(sessions) as s:  # b takes over: it resumes at a's position
        assert store.claim(s, partition=0, owner="b", epoch=7) == 10
        points = store.resume_points(s, partition=0)
    assert [(p.job, p.committed_seq, p.snapshot_seq) for p in points] == [("j", 10, 10)]
    with pytest.raises(store.Fenced), session_scope(sessions) as s:  # a wakes up: refused
        store.commit(s, partition=0, epoch=5, position=12, jobs=[_job_commit("j", 12)])
    with pytest.raises(store.Fenced), session_scope(sessions) as s:
        store.claim(s, partition=0, owner="a", epoch=6)
    with session_scope(sessions) as s:  # nothing of a's late commit was written
        assert store.resume_points(s, partition=0)[0].committed_seq == 10
        late = _job_commit("j", 15, snap=False)
        store.commit(s, partition=0, epoch=7, position=15, jobs=[late])
    with session_scope(sessions) as s:
        (p,) = store.resume_points(s, partition=0)
    assert (p.committed_seq, p.snapshot_seq) == (15, 10)
    first = _job_commit("new", 16, snap=False)
    with pytest.raises(ValueError, match="first commit"), session_scope(sessions) as s:
        store.commit(s, partition=0, epoch=7, position=16, jobs=[first])
    engine.dispose()


def test_the_registry_keeps_only_the_jobs_it_holds() -> None:
    evicted: list[str] = []
    held = {"mine"}
    reg = JobRegistry(settings=StateSettings(), load=lambda job: None, on_evict=evicted.append,
                      holds=lambda job: job in held)  # fmt: skip
    mine = reg.get_or_load("mine")
    assert reg.get_or_load("mine") is mine
    other = reg.get_or_load("other")  # read here, not kept
    assert reg.get("other") is None and other is not reg.get_or_load("other")
    restored = JobState("mine", StateSettings())
    reg.adopt("mine", restored)
    assert reg.get("mine") is restored and evicted == ["mine"]  # the old one's detector state goes
    reg.drop("mine")
    assert reg.get("mine") is None and evicted == ["mine", "mine"]
