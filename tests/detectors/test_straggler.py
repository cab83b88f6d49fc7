import numpy as np
import pytest

from failslow.detectors.straggler import PeerLatenessDetector, min_rule_lateness, peer_ratio
from failslow.detectors.types import KIND_INDEX, KINDS, Frame, PeerGroups

TP, DP, P2P = KIND_INDEX["tp"], KIND_INDEX["dp"], KIND_INDEX["p2p"]


def frame(step_time, comm_time, late_tp, late_dp, *, index=0) -> Frame:
    n = len(step_time)
    late = np.zeros((n, len(KINDS)))
    calls = np.zeros((n, len(KINDS)))
    late[:, TP], late[:, DP] = late_tp, late_dp
    calls[:, TP] = calls[:, DP] = 4
    return Frame(
        index,
        True,
        0,
        int(1e9),
        np.array(step_time, float),
        np.array(comm_time, float),
        late,
        calls,
        8 * n,
    )


def groups_2x2() -> PeerGroups:
    # ranks 0,1 = TP group A; 2,3 = TP group B; DP groups {0,2} and {1,3}
    return PeerGroups.from_groups(
        [np.array([0, 1]), np.array([2, 3]), np.array([0, 2]), np.array([1, 3])]
    )


def test_min_rule_clears_a_waiting_tp_peer() -> None:
    late = np.zeros((2, len(KINDS)))
    calls = np.zeros((2, len(KINDS)))
    late[0, TP], late[0, DP] = 0.1, 0.1  # the straggler: late everywhere
    late[1, TP], late[1, DP] = 0.0, 0.1  # its TP peer: late in DP only (it waited in TP)
    calls[:, TP] = calls[:, DP] = 1
    assert min_rule_lateness(late, calls).tolist() == [0.1, 0.0]


def test_min_rule_uses_p2p_only_when_nothing_else() -> None:
    late = np.zeros((1, len(KINDS)))
    calls = np.zeros((1, len(KINDS)))
    late[0, P2P], calls[0, P2P] = 0.2, 3
    assert min_rule_lateness(late, calls).tolist() == [0.2]


def test_peer_ratio_is_leave_one_out_and_minimum_over_groups() -> None:
    compute = np.array([1.5, 1.0, 1.0, 1.0])
    r = peer_ratio(compute, groups_2x2())
    assert r[0] == pytest.approx(1.5)
    assert r[1] == pytest.approx(1.0 / 1.5)  # min over its groups: vs rank 0 in TP
    assert r[3] == pytest.approx(1.0)


def _healthy(det: PeerLatenessDetector, frames: int, noise: float, seed: int = 0) -> None:
    """Healthy 4-rank frames whose compute and lateness jitter by ``noise`` seconds."""
    rng = np.random.default_rng(seed)
    for i in range(frames):
        jitter = rng.uniform(0, noise, 4)
        late = jitter - jitter.min()
        step = 1.0 + jitter.max()
        s = det.score(frame([step] * 4, step - 0.9 - jitter, late, late, index=i), groups_2x2())
        assert not s.suspect.any()


def test_small_job_raises_nothing_before_its_noise_is_known() -> None:
    det = PeerLatenessDetector()
    f = frame([1.5, 1.5, 1.5, 1.5], [0.1, 0.6, 0.6, 0.6], [0.5, 0, 0, 0], [0.5, 0.5, 0, 0])
    assert not det.score(f, groups_2x2()).suspect.any()


def test_small_noisy_job_needs_a_difference_beyond_its_own_noise() -> None:
    det = PeerLatenessDetector()
    _healthy(det, 40, noise=0.3)  # ranks take turns being up to 30% late
    # a rank 20% slower than its peers: inside this job's noise, so not a suspect
    f = frame([1.2] * 4, [0.0, 0.2, 0.2, 0.2], [0.2, 0, 0, 0], [0.2, 0.2, 0, 0])
    assert not det.score(f, groups_2x2()).suspect.any()
    # 3x slower stands out
    f = frame([3.0] * 4, [0.0, 2.0, 2.0, 2.0], [2.0, 0, 0, 0], [2.0, 2.0, 0, 0])
    assert det.score(f, groups_2x2()).suspect.tolist() == [True, False, False, False]


def test_compute_straggler_is_suspect_and_its_peers_are_not() -> None:
    det = PeerLatenessDetector()
    _healthy(det, 20, noise=0.01)
    # rank 0 computes 0.5 s more; peers wait for it in TP and DP;
    # rank 1 waits in TP but is late in DP.
    f = frame([1.5, 1.5, 1.5, 1.5], [0.1, 0.6, 0.6, 0.6], [0.5, 0, 0, 0], [0.5, 0.5, 0, 0])
    s = det.score(f, groups_2x2())
    assert s.suspect.tolist() == [True, False, False, False]
    assert s.compute_ratio[0] == pytest.approx(1.4 / 0.9)


def test_healthy_frame_has_no_suspects() -> None:
    det = PeerLatenessDetector()
    f = frame([1.0] * 4, [0.2] * 4, [0.001, 0.002, 0.0, 0.001], [0.001, 0.0, 0.002, 0.0])
    assert not det.score(f, groups_2x2()).suspect.any()


def test_score_is_permutation_invariant() -> None:
    det = PeerLatenessDetector()
    f = frame([1.5, 1.5, 1.5, 1.5], [0.1, 0.6, 0.6, 0.6], [0.5, 0, 0, 0], [0.5, 0.5, 0, 0])
    perm = np.array([2, 0, 3, 1])  # new slot i holds old slot perm[i]
    inv = np.argsort(perm)
    g = groups_2x2()
    pg = PeerGroups(tuple(inv[s] for s in g.stacks))
    pf = Frame(
        0,
        True,
        0,
        int(1e9),
        f.step_time[perm],
        f.comm_time[perm],
        f.late[perm],
        f.calls[perm],
        f.collectives,
    )
    a, b = det.score(f, g), det.score(pf, pg)
    assert b.suspect.tolist() == a.suspect[perm].tolist()
    np.testing.assert_allclose(b.compute_ratio, a.compute_ratio[perm])


def test_missing_rank_is_not_suspect() -> None:
    det = PeerLatenessDetector()
    f = frame([np.nan, 1.0, 1.0, 1.0], [0.0, 0.2, 0.2, 0.2], [0, 0, 0, 0], [0, 0, 0, 0])
    f.calls[0, :] = 0
    s = det.score(f, groups_2x2())
    assert not s.suspect[0] and np.isnan(s.late[0])


def test_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError):
        PeerLatenessDetector(compute_ratio=1.0)


def test_a_rank_held_up_by_its_pipeline_neighbour_is_not_the_straggler() -> None:
    """Issue 16: 2 stages x 2 data-parallel ranks (slots 0, 1 in stage 0; 2, 3 in stage 1).
    Slot 3 is late in its data-parallel all-reduces (2 overlapping buckets, 0.2 s each) only
    because it waited 0.2 s longer than slot 2 for its activations; slot 1 is late by as much
    with no extra wait (its own compute)."""
    from failslow.detectors.straggler import pipeline_delayed

    f = frame([0.8] * 4, [0.3] * 4, [0.0] * 4, [0.0, 0.4, 0.0, 0.4])
    f.calls[:, TP] = 0
    f.calls[:, DP] = 2
    busy = np.zeros((4, len(KINDS)))
    busy[:, P2P] = [0.1, 0.1, 0.1, 0.3]
    f = Frame(**{**{k: getattr(f, k) for k in Frame.__slots__}, "busy": busy})
    dp = PeerGroups.from_groups([np.array([0, 1]), np.array([2, 3])])
    assert pipeline_delayed(f, dp).tolist() == [False, False, False, True]
    # no p2p at all (no pipeline): nobody's lateness is inherited
    g = Frame(**{**{k: getattr(f, k) for k in Frame.__slots__}, "busy": np.zeros((4, len(KINDS)))})
    assert not pipeline_delayed(g, dp).any()
