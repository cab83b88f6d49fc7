"""Communicator members over all jobs are bounded (issue 17): the per-job caps do not bound a
flood of jobs each at its cap."""

from __future__ import annotations

import time

import pytest

from failslow.service.stream.records import CommAnnouncement, RecordError
from failslow.service.stream.registry import JobRegistry
from failslow.service.stream.settings import StateSettings


def comm(name: str, n: int) -> CommAnnouncement:
    return CommAnnouncement(name, "dp", tuple(range(n)))


def test_the_budget_spans_jobs_and_is_given_back_when_a_job_leaves() -> None:
    reg = JobRegistry(settings=StateSettings(max_total_comm_members=10), load=lambda job: None)
    a, b = reg.get_or_load("a"), reg.get_or_load("b")
    a.topology.announce_comm(comm("world", 8))
    assert reg.members.used == 8
    with pytest.raises(RecordError, match="over all jobs.*MAX_TOTAL_COMM_MEMBERS"):
        b.topology.announce_comm(comm("world", 8))
    b.topology.announce_comm(comm("pair", 2))  # what still fits is taken
    assert reg.members.used == 10
    assert reg.evict_idle(now_wall=time.monotonic() + 10 * 24 * 3600) == ["a", "b"]
    assert reg.members.used == 0
    c = reg.get_or_load("c")
    c.topology.announce_comm(comm("world", 8))  # room again
    reg.drop("c")
    assert reg.members.used == 0


def test_a_job_loaded_with_its_members_counts_them() -> None:
    def load(job: str):  # type: ignore[no-untyped-def]
        from failslow.service.stream.state import JobState

        state = JobState(job, StateSettings())
        state.topology.announce_comm(comm("world", 6))
        return state

    reg = JobRegistry(settings=StateSettings(max_total_comm_members=10), load=load)
    reg.get_or_load("a")
    assert reg.members.used == 6
    with pytest.raises(RecordError):
        reg.get_or_load("b")  # loading is never refused ...
        reg.get("b").topology.announce_comm(comm("more", 6))  # type: ignore[union-attr]
    assert reg.members.used == 12  # ... even past the limit; new comms are
