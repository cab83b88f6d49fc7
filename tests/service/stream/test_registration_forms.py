"""A large comm named again in the range form it was registered with is checked without expanding
its members; every rule still holds for what differs from that form."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from failslow.service.stream import columnar, parse
from failslow.service.stream.columnar import FORM_MIN, RegistrationError
from failslow.service.stream.settings import StateSettings
from failslow.service.stream.state import JobState

BIG = {"comm": "dp0", "kind": "dp", "ranks": {"start": 0, "stop": 2 * FORM_MIN, "step": 2}}
SMALL = {"comm": "tp0", "kind": "tp", "ranks": {"start": 0, "stop": 8}}


def _register(state: JobState, host: str, rank: int, comms: list[Any]) -> columnar.HostTopology:
    state.topology.touch_host(host, 1, 0.0)
    return columnar.register_topology(state, host, [{"rank": rank, "gpu": 0}], comms)


@pytest.fixture()
def state() -> JobState:
    s = JobState("j", StateSettings())
    _register(s, "h0", 0, [BIG, SMALL])
    return s


@pytest.fixture()
def expanded(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The member specs that were expanded (parse.members) from here on."""
    seen: list[Any] = []
    real = parse.members

    def counting(spec: Any) -> tuple[int, ...]:
        seen.append(spec)
        return real(spec)

    monkeypatch.setattr(parse, "members", counting)
    return seen


def test_the_same_form_again_is_not_expanded(state: JobState, expanded: list[Any]) -> None:
    assert state.topology.comm_forms == {"dp0": ("dp", 0, 2 * FORM_MIN, 2)}  # not tp0: small
    ht = _register(state, "h1", 2, [BIG, SMALL])
    assert expanded == [SMALL["ranks"]]
    assert ht.tables.position[0].tolist() == [1]  # rank 2 is dp0's second member
    assert ht.comm_size.tolist() == [FORM_MIN, 8]


def test_the_same_members_in_another_form_are_checked_in_full(
    state: JobState, expanded: list[Any]
) -> None:
    other_stop = {**BIG, "ranks": {"start": 0, "stop": 2 * FORM_MIN - 1, "step": 2}}
    as_list = {**BIG, "ranks": list(range(0, 2 * FORM_MIN, 2))}
    _register(state, "h1", 2, [other_stop])
    _register(state, "h2", 4, [as_list])
    assert len(expanded) == 2


@pytest.mark.parametrize(
    "comm,why",
    [
        ({**BIG, "kind": "pp"}, "conflicting definition"),
        ({**BIG, "ranks": {"start": 0, "stop": 2 * FORM_MIN + 2, "step": 2}}, "conflicting"),
        ({**BIG, "ranks": {"start": 0, "stop": 2 * FORM_MIN, "step": True}}, "integers"),
        ({**BIG, "ranks": {"start": 0, "stop": 2 * FORM_MIN, "step": 2, "x": 1}}, "integers"),
        ({**BIG, "ranks": {"start": False, "stop": 2 * FORM_MIN, "step": 2}}, "integers"),
    ],
)
def test_what_differs_from_the_form_is_refused_as_before(
    state: JobState, comm: dict[str, Any], why: str
) -> None:
    with pytest.raises(RegistrationError, match=why):
        _register(state, "h1", 2, [comm])
    with pytest.raises(RegistrationError, match="listed twice"):
        _register(state, "h1", 2, [BIG, BIG])


def test_forms_survive_a_snapshot_and_old_snapshots_load(state: JobState) -> None:
    back = pickle.loads(pickle.dumps(state.topology))
    assert back.comm_forms == state.topology.comm_forms
    del state.topology.__dict__["comm_forms"]  # as a snapshot pickled before forms existed
    old = pickle.loads(pickle.dumps(state.topology))
    assert old.comm_forms == {}
    state.topology = old
    _register(state, "h1", 2, [BIG])  # checked in full, then remembered again
    assert old.comm_forms == {"dp0": ("dp", 0, 2 * FORM_MIN, 2)}
