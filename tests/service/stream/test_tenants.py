"""Tenants cannot hurt each other, and nothing acknowledged leaves memory unsaved (issue 31,
cases 2 and 3). A token scoped to ``teamA-*`` once sent heartbeats for 1,100 unknown
``teamA-*`` jobs: each was refused (409) yet made a job, and past ``max_jobs`` teamB's job was
evicted 30 times in 42 s with everything it had been sent; four teamA jobs of range
registrations took every communicator member of the service, and teamB's registrations were
422."""

from __future__ import annotations

from typing import Any

import pytest

from failslow.service.stream.records import CommAnnouncement, RecordError
from failslow.service.stream.registry import JobRegistry, RegistryFull
from failslow.service.stream.settings import StateSettings
from failslow.service.stream.state import JobState


def _tenant(job: str) -> str | None:
    return {"a": "teamA-*", "b": "teamB-*"}.get(job[0])


def _registry(saved: list[list[str]] | None = None, **kw: Any) -> JobRegistry:
    save = None if saved is None else (lambda states: saved.append([s.job for s in states]))
    return JobRegistry(settings=StateSettings(**kw), load=lambda job: None, tenant_of=_tenant,
                       save=save)  # fmt: skip


def test_a_tenant_at_its_share_of_max_jobs_evicts_only_its_own_jobs() -> None:
    reg = _registry(max_jobs=6, tenant_share=0.5)
    reg.get_or_load("b1")
    for i in range(20):  # teamA makes job after job
        reg.get_or_load(f"a{i}")
        held = {s.job for s in reg.all()}
        assert "b1" in held and sum(j.startswith("a") for j in held) <= 3
    assert sorted(s.job for s in reg.all()) == ["a17", "a18", "a19", "b1"]
    reg.get_or_load("x")  # a job of no tenant shares what is left
    reg.get_or_load("y")
    with pytest.raises(RegistryFull):  # every job busy: nothing can leave
        for s in reg.all():
            s.committing = 1
        reg.get_or_load("z")


def test_a_tenant_has_a_share_of_the_services_members() -> None:
    reg = _registry(max_total_comm_members=20, tenant_share=0.5)
    a1, a2, b1 = reg.get_or_load("a1"), reg.get_or_load("a2"), reg.get_or_load("b1")
    a1.topology.announce_comm(CommAnnouncement("w", "dp", tuple(range(8))))
    with pytest.raises(RecordError, match="tenant 'teamA-\\*'.*share of 10.*TENANT_SHARE"):
        a2.topology.announce_comm(CommAnnouncement("w", "dp", tuple(range(8))))
    a2.topology.announce_comm(CommAnnouncement("p", "dp", (0, 1)))  # what fits its share
    b1.topology.announce_comm(CommAnnouncement("w", "dp", tuple(range(10))))  # teamB's own
    assert reg.members.used == 20
    reg.drop("a1")
    assert reg.members.used == 12 and reg._budget("teamA-*").used == 2


def test_a_job_with_unsaved_data_leaves_memory_only_after_its_snapshot() -> None:
    saved: list[list[str]] = []
    reg = _registry(saved, max_jobs=2)
    old, _ = reg.get_or_load("j1"), reg.get_or_load("j2")
    old.unsaved = True  # acknowledged since its last snapshot
    reg.get("j2").unsaved = True  # type: ignore[union-attr]
    with pytest.raises(RegistryFull, match="none can leave memory now"):
        reg.get_or_load("j3")
    assert saved == [["j1", "j2"]]  # their snapshots asked for, the least recent first
    assert {s.job for s in reg.all()} == {"j1", "j2"}
    old.unsaved = False  # the snapshot was written
    reg.get_or_load("j3")
    assert {s.job for s in reg.all()} == {"j2", "j3"}


def test_without_snapshots_a_job_leaves_as_before() -> None:
    reg = _registry(None, max_jobs=1)
    reg.get_or_load("j1").unsaved = True
    reg.get_or_load("j2")
    assert [s.job for s in reg.all()] == ["j2"]


def test_existing_makes_no_job() -> None:
    reg = JobRegistry(settings=StateSettings(), load=lambda job: None)
    assert reg.existing("nobody") is None and reg.all() == []
    stored = JobState("s", StateSettings())
    reg2 = JobRegistry(settings=StateSettings(), load=lambda job: stored if job == "s" else None)
    assert reg2.existing("s") is stored and [s.job for s in reg2.all()] == ["s"]
