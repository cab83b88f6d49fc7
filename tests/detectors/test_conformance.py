"""One conformance suite over every registered detector (STYLE: river's per-estimator checks)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from failslow.detectors.registry import PEER, SERIES
from failslow.detectors.types import KIND_INDEX, KINDS, Frame, JobShape, PeerGroups

# -- series detectors -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SERIES))
def test_series_warms_up_with_none(name: str) -> None:
    det = SERIES[name]()
    det.learn_one(1.0)
    assert det.score_one() is None


@pytest.mark.parametrize("name", sorted(SERIES))
def test_series_constant_stream_never_alarms(name: str) -> None:
    det = SERIES[name]()
    scores = []
    for _ in range(300):
        det.learn_one(5.0)
        scores.append(det.score_one())
    assert max(s for s in scores if s is not None) < 0.5


@pytest.mark.parametrize("name", sorted(SERIES))
def test_series_score_is_pure(name: str) -> None:
    det = SERIES[name]()
    for x in np.random.default_rng(0).normal(0, 1, 50):
        det.learn_one(float(x))
    assert det.score_one() == det.score_one()


@pytest.mark.parametrize("name", sorted(SERIES))
def test_series_state_round_trips(name: str) -> None:
    rng = np.random.default_rng(4)
    det = SERIES[name]()
    for x in rng.normal(0, 1, 80):
        det.learn_one(float(x))
    twin = pickle.loads(pickle.dumps(det))
    for x in np.r_[rng.normal(0, 1, 20), rng.normal(6, 1, 30)]:
        det.learn_one(float(x))
        twin.learn_one(float(x))
        assert det.score_one() == twin.score_one()


@pytest.mark.parametrize("name", sorted(SERIES))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_series_seeded_step_change_is_found_within_ten_samples(name: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    det = SERIES[name]()
    first = None
    for t, x in enumerate(np.r_[rng.normal(10, 0.2, 200), rng.normal(12, 0.2, 60)]):
        det.learn_one(float(x))
        s = det.score_one()
        if t >= 200 and s is not None and s >= 0.5 and first is None:
            first = t
    assert first is not None and first - 200 <= 10


# -- peer detectors --------------------------------------------------------------------------------
TP, DP = KIND_INDEX["tp"], KIND_INDEX["dp"]


def job(n_hosts: int = 4, per_host: int = 4) -> JobShape:
    """TP groups inside hosts, DP groups across them."""
    n = n_hosts * per_host
    tp = [np.arange(h * per_host, (h + 1) * per_host) for h in range(n_hosts)]
    dp = [np.arange(i, n, per_host) for i in range(per_host)]
    return JobShape(
        hosts=tuple(f"h{i}" for i in range(n_hosts)),
        host_of_slot=np.repeat(np.arange(n_hosts), per_host),
        groups=PeerGroups.from_groups(tp + dp),
        cross_groups=PeerGroups.from_groups(dp),
        comm_kind=np.zeros(0, np.int64),
        comm_size=np.zeros(0, np.int64),
        comm_hosts=(),
        comm_edges=(),
    )


def frame(compute: np.ndarray, shape: JobShape) -> Frame:
    """A step where each rank computes ``compute[i]`` seconds, then its TP and DP collectives."""
    n = compute.size
    step = float(compute.max()) + 0.05
    comm = step - compute
    late = np.zeros((n, len(KINDS)))
    calls = np.zeros((n, len(KINDS)))
    for stack, kind in ((shape.groups.stacks[0], TP), (shape.cross_groups.stacks[0], DP)):
        for g in stack:
            c = compute[g]
            others = np.array([np.median(np.delete(c, i)) for i in range(c.size)])
            late[g, kind] = np.maximum(0, c - others)
            calls[g, kind] = 4
    return Frame(0, True, 0, int(step * 1e9), np.full(n, step), comm, late, calls, 8 * n)


def permuted(shape: JobShape, fr: Frame, perm: np.ndarray) -> tuple[JobShape, Frame]:
    """New slot i holds old slot perm[i]."""
    inv = np.argsort(perm)
    ps = JobShape(
        shape.hosts,
        shape.host_of_slot[perm],
        PeerGroups(tuple(inv[s] for s in shape.groups.stacks)),
        PeerGroups(tuple(inv[s] for s in shape.cross_groups.stacks)),
        shape.comm_kind,
        shape.comm_size,
        shape.comm_hosts,
        shape.comm_edges,
    )
    pf = Frame(
        fr.index,
        fr.has_steps,
        fr.start_ns,
        fr.end_ns,
        fr.step_time[perm],
        fr.comm_time[perm],
        fr.late[perm],
        fr.calls[perm],
        fr.collectives,
    )
    return ps, pf


@pytest.mark.parametrize("name", sorted(PEER))
def test_peer_identical_members_raise_nothing(name: str) -> None:
    shape = job()
    assert not PEER[name]().suspects(frame(np.full(16, 0.4), shape), shape).any()


@pytest.mark.parametrize("name,culprits", [("peer_lateness", [6]), ("slow_node", [8, 9, 10, 11])])
def test_peer_seeded_anomaly_is_found(name: str, culprits: list[int]) -> None:
    shape = job()
    compute = np.full(16, 0.4)
    compute[culprits] = 0.6
    found = PEER[name]().suspects(frame(compute, shape), shape)
    assert np.flatnonzero(found).tolist() == culprits


@pytest.mark.parametrize("name", sorted(PEER))
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), slow=st.integers(0, 15))
def test_peer_permutation_invariance(name: str, seed: int, slow: int) -> None:
    rng = np.random.default_rng(seed)
    shape = job()
    compute = 0.4 * np.exp(rng.normal(0, 0.01, 16))
    compute[slow] *= 1.5
    fr = frame(compute, shape)
    perm = rng.permutation(16)
    ps, pf = permuted(shape, fr, perm)
    det = PEER[name]()
    assert det.suspects(pf, ps).tolist() == det.suspects(fr, shape)[perm].tolist()
