"""A job's bounds follow what it has shown, not what it declares (issue 31, case 4): a one-rank
registration declaring 2^31-1 ranks was accepted and scaled every per-job bound with it (2.16M
collectives pending where a two-rank job caps at 200K), and a refused registration declaring
4,096 ranks still started shard processes."""

from __future__ import annotations

import pytest

from failslow.service.stream import columnar
from failslow.service.stream.records import RankAnnouncement, RecordError
from failslow.service.stream.settings import Limits, StateSettings
from failslow.service.stream.state import JobState


def _register(state: JobState, host: str, ranks: list[dict], comms: list[dict]) -> None:
    with state.lock:
        columnar.register_topology(state, host, ranks, comms)


def test_a_declared_world_past_max_ranks_is_refused() -> None:
    state = JobState("j", StateSettings())
    with pytest.raises(columnar.RegistrationError, match="world_size exceeds"):
        _register(state, "h0", [{"rank": 0, "gpu": 0, "world_size": 2**31 - 1}], [])
    assert state.topology.n_slots == 0 and state.limits == Limits.of(state.settings, None)
    with pytest.raises(RecordError, match="world_size exceeds"):  # v1's announcements too
        state.topology.announce_rank("h0", RankAnnouncement(0, 0, 2_000_000))


def test_bounds_follow_the_ranks_shown_not_the_world_declared() -> None:
    settings = StateSettings()
    state = JobState("j", settings)
    _register(state, "h0", [{"rank": 0, "gpu": 0, "world_size": settings.max_ranks}], [])
    assert state.limits == Limits.of(settings, 1)  # the floors: one rank shown
    assert state.assembly.joiner.max_pending == settings.max_pending_collectives
    # a host naming a 100,000-member comm shows 100,000 ranks: the bounds grow with them
    world = {"comm": "dp", "kind": "dp", "ranks": {"start": 0, "stop": 100_000}}
    _register(state, "h1", [{"rank": 1, "gpu": 0}], [world])
    assert state.limits == Limits.of(settings, 100_000)
    assert state.limits.pending == int(settings.pending_per_rank * 100_000)


def test_comms_per_registration_are_bounded_by_the_ranks_it_shows() -> None:
    """120K comms in one registration of two ranks were accepted under a declared huge world."""
    settings = StateSettings(max_comms=1_000)
    state = JobState("j", settings)
    big = settings.max_ranks  # declared, allowed, and not what the bounds follow
    ranks = [{"rank": 0, "gpu": 0, "world_size": big}, {"rank": 1, "gpu": 1, "world_size": big}]
    comms = [{"comm": f"c{i}", "kind": "dp", "ranks": [0, 1]} for i in range(1_001)]
    with pytest.raises(columnar.RegistrationError, match="exceeds 1000 comms"):
        _register(state, "h0", ranks, comms)
    assert state.topology.n_comms == 0


def test_a_refused_registration_starts_no_shard() -> None:
    state = JobState("j", StateSettings(shards=2, shard_min_ranks=8))
    try:
        bad = [{"rank": 0, "gpu": 0, "world_size": 4096}, {"rank": 0, "gpu": 1}]  # twice
        with pytest.raises(columnar.RegistrationError):
            _register(state, "h0", bad, [])
        assert state.shards is None
        _register(state, "h0", [{"rank": 0, "gpu": 0, "world_size": 4096}], [])
        assert state.shards is None  # one rank shown, whatever it declares
    finally:
        state.close()
