"""Jobs whose compute is unobservable (communication overlaps it, FSDP2 x TP x PP): their ranks
are judged on lateness against its pooled noise, the straggler is the rank that waits least, and
a compute ratio is never read off a small difference of two large numbers."""

import numpy as np
import pytest

from failslow.detectors.blind import (
    BLIND_BELOW,
    ROLL,
    Observability,
    RollingLateness,
    on_slow_nic,
    unobservable,
    waits_least,
)
from failslow.detectors.straggler import PeerLatenessDetector
from failslow.detectors.types import KIND_INDEX, KINDS, Frame, PeerGroups

TP, DP = KIND_INDEX["tp"], KIND_INDEX["dp"]


def overlapped_frame(late: np.ndarray, comm_share: np.ndarray, index: int) -> Frame:
    """8 ranks, 250 ms steps, communication filling ``comm_share`` of each rank's step."""
    n = late.size
    lates = np.zeros((n, len(KINDS)))
    calls = np.zeros((n, len(KINDS)))
    lates[:, TP] = lates[:, DP] = late
    calls[:, TP] = calls[:, DP] = 6
    step = np.full(n, 0.25)
    return Frame(index, True, 0, int(2.5e8), step, step * comm_share, lates, calls, 12 * n)


def groups_8() -> PeerGroups:
    tp = [np.array([2 * i, 2 * i + 1]) for i in range(4)]
    dp = [np.array([0, 2]), np.array([1, 3]), np.array([4, 6]), np.array([5, 7])]
    return PeerGroups.from_groups(tp + dp)


def test_compute_is_unknown_where_communication_fills_the_step() -> None:
    step = np.array([0.25, 0.25, 0.25])
    comm = np.array([0.10, 0.23, 0.30])  # overlapped calls can sum past the step
    assert unobservable(step, comm).tolist() == [False, True, True]


def test_observability_is_the_mean_share_then_smoothed() -> None:
    obs = Observability()
    assert obs.update(np.array([True, False, False, False])) is True  # first frame: its share
    assert obs.share == pytest.approx(0.25)
    for _ in range(200):
        blind = obs.update(np.ones(8, dtype=bool))
    assert not blind and obs.share > BLIND_BELOW
    blind = obs.update(np.zeros(8, dtype=bool))  # one frame does not make a job blind
    assert not blind


def test_rolling_lateness_needs_most_frames_and_known_noise() -> None:
    roll = RollingLateness()
    for _ in range(ROLL - 1):
        z = roll.z(np.array([0.1, 0.0]), 0.05)
    assert np.isneginf(z).all()  # too few frames yet
    z = roll.z(np.array([0.1, 0.0]), 0.05)
    assert z[0] == pytest.approx(0.1 / (0.05 / np.sqrt(ROLL)))
    assert z[1] == pytest.approx(0.0)
    z = roll.z(np.array([np.nan, 0.0]), float("nan"))
    assert np.isneginf(z).all()  # noise unknown: no rolling score


def test_the_straggler_waits_least_and_a_slow_nic_explains_its_host() -> None:
    assert waits_least(np.array([0.8, 1.0, 1.3, np.nan])).tolist() == [True, True, False, True]
    host = np.array([0, 0, 1, -1, 5])
    assert on_slow_nic(host, np.array([0.75, 0.2])).tolist() == [True, True, False, False, False]


def test_a_blind_job_whose_ranks_take_turns_being_late_raises_nothing() -> None:
    """Each rank is 0-10% of a step late, and one at random 12-40% more, as 8 ranks on 2 cores
    are (the lab's pooled spread of lateness: 0.028 of a step); judged frame by frame across
    ranks, that flagged a slow GPU every few dozen frames."""
    from failslow.detectors.defaults import DEFAULTS

    det = PeerLatenessDetector()
    rng = np.random.default_rng(3)
    bits = []
    for i in range(300):
        late = rng.uniform(0.0, 0.025, 8)
        late[rng.integers(8)] += rng.uniform(0.03, 0.1)
        s = det.score(overlapped_frame(late, np.full(8, 0.95), i), groups_8())
        if i >= 30:
            assert s.blind and s.shaky
            bits.append(s.suspect)
    window, need = DEFAULTS.noisy_blind_evidence
    counts = np.lib.stride_tricks.sliding_window_view(np.array(bits), window, axis=0).sum(-1)
    assert counts.max() < need, counts.max()  # a slow GPU needs `need` of `window` frames


def test_a_blind_job_finds_the_rank_late_in_every_frame() -> None:
    det = PeerLatenessDetector()
    rng = np.random.default_rng(4)
    flagged = []
    for i in range(120):
        late = rng.uniform(0.0, 0.012, 8)
        late[rng.integers(8)] = rng.uniform(0.015, 0.05)
        share = np.full(8, 0.95)
        if i >= 60:  # rank 5 computes slower: 25 ms late in every frame, waits least
            late[5] = 0.025 + rng.uniform(0.0, 0.01)
            share[5] = 0.8
        s = det.score(overlapped_frame(late, share, i), groups_8())
        if i >= 60:
            flagged.append(bool(s.suspect[5]))
    assert sum(flagged[ROLL:]) >= 0.9 * len(flagged[ROLL:]), flagged


def test_a_blind_jobs_rank_that_waits_longest_is_no_straggler() -> None:
    """Both ends of a slow link are late for their peers and wait longer inside communication
    than they do: no slow GPU."""
    det = PeerLatenessDetector()
    rng = np.random.default_rng(5)
    for i in range(120):
        late = rng.uniform(0.0, 0.012, 8)
        share = np.full(8, 0.9)
        if i >= 60:
            late[5] = 0.04
            share[5] = 1.3  # its calls take longer: the transfers are slow
        s = det.score(overlapped_frame(late, share, i), groups_8())
        if i >= 60:
            assert not s.suspect[5]
