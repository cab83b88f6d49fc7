"""The culprit's share of the job's critical path (detectors/impact.py), on frames whose truth is
known by construction."""

import numpy as np

from failslow.detectors.impact import critical_path, impact


def dp_frames(computes: list[float], comm: float = 0.1, k: int = 6):
    """A data-parallel job: every rank waits for the slowest, then communicates."""
    c = np.array(computes, dtype=float)[:, None].repeat(k, axis=1)
    step = np.full(k, c.max() + comm)
    peer = np.median(c, axis=0)
    ratio = c / peer
    late = np.zeros_like(c)
    return step, c, ratio, late


def test_one_slow_rank_costs_its_excess():
    step, c, ratio, late = dp_frames([1.0, 1.0, 1.0, 1.8, 1.0, 1.0])
    culprit = np.arange(6) == 3
    cost = critical_path(step, c, ratio, late, culprit)
    # 1.9 s now; without its 0.8 s excess: 1.1 s
    assert abs(cost.without_s - 1.1) < 1e-9 and abs(cost.excess_s - 0.8) < 1e-9
    assert abs(cost.ratio - 1.9 / 1.1) < 1e-9


def test_of_two_slow_ranks_each_is_credited_only_beyond_the_other():
    step, c, ratio, late = dp_frames([1.0, 1.5, 1.0, 1.8, 1.0, 1.0])
    worst = critical_path(step, c, ratio, late, np.arange(6) == 3)
    second = critical_path(step, c, ratio, late, np.arange(6) == 1)
    # without rank 3 the step is rank 1's: 1.6 s; without rank 1 nothing changes
    assert abs(worst.without_s - 1.6) < 1e-9
    assert second.ratio == 1.0


def test_a_rank_slow_since_the_start_has_a_cost_without_any_healthy_past():
    # every frame has the culprit slow: there is no "before", the cost is still measured
    step, c, ratio, late = dp_frames([2.0, 1.0, 1.0, 1.0], k=3)
    cost = critical_path(step, c, ratio, late, np.arange(4) == 0)
    assert abs(cost.ratio - 2.1 / 1.1) < 1e-9


def test_waiting_peers_bound_the_saving_where_compute_is_unknown():
    k = 4
    step = np.full(k, 1.0)
    c = np.full((3, k), np.nan)
    ratio = np.full((3, k), np.nan)
    late = np.zeros((3, k))
    late[2] = 0.3  # its peers wait 0.3 s per step for it
    cost = critical_path(step, c, ratio, late, np.arange(3) == 2)
    assert abs(cost.without_s - 0.7) < 1e-9


def test_a_pipelines_bubbles_are_not_someone_elses_excess():
    # stage 1's "compute" holds its bubble (1.5 s vs 1.0 s for stage 0), matched by its peers
    k = 4
    c = np.array([[1.8] * k, [1.0] * k, [1.5] * k, [1.5] * k])
    ratio = np.array([[1.8] * k, [1.0] * k, [1.0] * k, [1.0] * k])
    step = np.full(k, 2.0)
    cost = critical_path(step, c, ratio, np.zeros_like(c), np.arange(4) == 0)
    assert abs(cost.excess_s - 0.8) < 1e-9 and abs(cost.without_s - 1.2) < 1e-9


def test_severity_follows_the_attributed_cost_where_measured():
    assert impact(1.4, 1.02) == 1.02  # another fault's share of the job slowdown is not its own
    assert impact(1.4, None) == 1.4
    assert impact(float("nan"), float("nan")) != impact(float("nan"), float("nan"))  # NaN


def test_the_job_cannot_pay_more_for_it_than_its_step_time_grew():
    # a last-stage rank 1.5x slow inside the pipeline's bubbles: an excess, but the job's step
    # time before its onset was the same (1.9 s): it costs nothing
    step, c, ratio, late = dp_frames([1.0, 1.0, 1.0, 1.5, 1.0, 1.0], comm=0.4)
    culprit = np.arange(6) == 3
    before = np.full(8, 1.9)
    assert critical_path(step, c, ratio, late, culprit, before=before).ratio == 1.0
    # before it the step was 1.4 s: the bound allows the whole measured excess
    grew = critical_path(step, c, ratio, late, culprit, before=np.full(8, 1.4))
    assert abs(grew.ratio - 1.9 / 1.4) < 1e-9
    # too few frames before the onset to bound anything
    assert critical_path(step, c, ratio, late, culprit, before=np.full(3, 1.9)).ratio > 1.3
