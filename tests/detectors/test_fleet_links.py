"""A NIC's speed from passive data (detectors/fleet_links.py): each host's fastest communicator,
only where its communicators share no other host; and the tally the fleet ledger takes."""

from __future__ import annotations

import math
import pickle

import numpy as np

from failslow.detectors.fleet import FleetModel, Health, JobReading, health, speed_cost, taus_of
from failslow.detectors.fleet_links import MIN_HOSTS, FleetTally, host_links, separable
from failslow.detectors.link import LinkScores
from failslow.detectors.types import JobShape, PeerGroups


def shape_of(hosts: int, comms: list[tuple[int, ...]]) -> JobShape:
    """A job of ``hosts`` hosts (one rank each) whose communicators span ``comms``."""
    ch = [(c, h) for c, hs in enumerate(comms) for h in hs]
    return JobShape(
        hosts=tuple(f"h{i}" for i in range(hosts)),
        host_of_slot=np.arange(hosts),
        groups=PeerGroups(()),
        cross_groups=PeerGroups(()),
        comm_kind=np.zeros(len(comms), np.int64),
        comm_size=np.array([len(c) for c in comms], np.int64),
        comm_hosts=tuple(tuple(c) for c in comms),
        comm_edges=tuple(frozenset() for _ in comms),
        ch_comm=np.array([c for c, _ in ch], np.int64),
        ch_host=np.array([h for _, h in ch], np.int64),
    )


# four hosts, a data-parallel ring over all of them and a pipeline's pairs around them
RING = [(0, 1, 2, 3), (0, 1), (1, 2), (2, 3), (3, 0)]
RING_SHAPE = shape_of(4, RING)


def ratios(shape: JobShape, slow_host: int | None, factor: float) -> np.ndarray:
    """Every communicator at its reference, those through ``slow_host`` ``1/factor`` of it."""
    out = np.ones(len(shape.comm_hosts))
    if slow_host is not None:
        out[[slow_host in hs for hs in shape.comm_hosts]] = 1.0 / factor
    return out


def test_a_host_is_separable_only_where_no_other_host_is_in_all_its_communicators() -> None:
    assert separable(RING_SHAPE, np.ones(5, bool)).tolist() == [True] * 4
    # the ring alone: every other host is in every communicator of each
    assert not separable(RING_SHAPE, np.array([1, 0, 0, 0, 0], bool)).any()
    # without the pair (1, 2): host 1's communicators are the ring and (0, 1), both hold 0
    sep = separable(RING_SHAPE, np.array([1, 1, 0, 1, 1], bool))
    assert sep.tolist() == [True, False, False, True]


def test_a_slow_nic_reads_its_own_slowness_and_nobody_else_does() -> None:
    slow = host_links(RING_SHAPE, ratios(RING_SHAPE, 2, 1.3))[0]
    # host 2's fastest communicator is slow; every other host has one that avoids it
    assert math.isclose(slow[2], 1.3) and np.allclose(slow[[0, 1, 3]], 1.0)
    assert np.allclose(host_links(RING_SHAPE, ratios(RING_SHAPE, None, 1.0))[0], 1.0)


def test_no_reading_where_passive_data_cannot_tell_the_hosts_apart() -> None:
    ring_only = shape_of(4, [(0, 1, 2, 3), (0, 1, 2, 3)])
    assert np.isnan(host_links(ring_only, ratios(ring_only, 2, 2.0))[0]).all()
    # a frame without data on two pairs leaves two hosts unseparated: too few to judge
    r = ratios(RING_SHAPE, None, 1.0)
    r[[2, 3]] = np.nan
    assert MIN_HOSTS == 3 and np.isnan(host_links(RING_SHAPE, r)[0]).all()


def _links(ratio: np.ndarray) -> LinkScores:
    n = ratio.size
    no = np.zeros(n, bool)
    return LinkScores(ratio, ratio, no, no, np.zeros(0), no, {})


def test_the_tally_keeps_hosts_by_name_across_topology_changes() -> None:
    t = FleetTally()
    rng = np.random.default_rng(1)
    for _ in range(15):
        r = ratios(RING_SHAPE, 2, 1.25) * np.exp(rng.normal(0, 0.01, 5))
        t.add(np.ones(4), 1.0, RING_SHAPE, _links(r))
    t = pickle.loads(pickle.dumps(t))  # a replica's snapshot: without the shape, kept by name
    assert "_shape" not in t.__getstate__()
    # the job's hosts renumbered (a host joined in front): h2 is still h2
    moved = shape_of(5, [tuple(h + 1 for h in c) for c in RING] + [(0, 1)])
    moved = JobShape(("h9", "h0", "h1", "h2", "h3"), *(getattr(moved, f) for f in (
        "host_of_slot", "groups", "cross_groups", "comm_kind", "comm_size", "comm_hosts",
        "comm_edges", "ch_comm", "ch_host")))  # fmt: skip
    for _ in range(15):
        t.add(np.ones(5), 1.0, moved, _links(ratios(moved, 3, 1.25)))
    r2 = t.link_reading("h2")
    assert r2 is not None and r2.n == 30 and math.isclose(math.exp(r2.mean), 1.25, rel_tol=0.02)
    assert r2.observed_s == 30.0
    r0 = t.link_reading("h0")
    assert r0 is not None and abs(r0.mean) < 0.02
    assert t.link_reading("h9") is None  # in one pair only: never separable
    assert t.reading(0) is not None and t.reading(0).n == 30  # the compute tally beside it


def test_passive_readings_flag_a_chronically_slow_nic_after_a_few_jobs_and_no_healthy_one() -> None:
    """A NIC 1.3x slower in every job (below every per-job link threshold) is flagged after a
    few jobs' passive readings; 60 healthy NICs over 10 jobs each, never."""
    model = FleetModel().links()
    rng = np.random.default_rng(7)

    def job(mu: float) -> JobReading:
        y = rng.normal(mu + rng.normal(0, 0.01), 0.03, 150)
        return JobReading(y.size, float(y.mean()), float(y.var()), 150.0)

    healthy = [[job(0.0) for _ in range(10)] for _ in range(60)]
    slow = [job(math.log(1.3)) for _ in range(10)]
    _, passive_tau = taus_of([r for rs in healthy for r in rs] + slow, model)
    assert 0.03 <= passive_tau < 0.05

    def judged(rs: list[JobReading]) -> bool:
        return health(rs, [], now_s=0.0, tau=0.15, fleet_rate_per_h=0.0, model=model,
                      passive_tau=passive_tau).slow  # fmt: skip

    assert not any(judged(rs) for rs in healthy)
    flagged = next(k for k in range(1, 11) if judged(slow[:k]))
    assert 3 <= flagged <= 6, flagged
    # the checks' spread (0.15) alone would not flag it in ten jobs
    assert not health(slow, [], now_s=0.0, tau=0.15, fleet_rate_per_h=0.0, model=model).slow
    h = health(slow, [], now_s=0.0, tau=0.15, fleet_rate_per_h=0.0, model=model,
               passive_tau=passive_tau)  # fmt: skip
    assert "over 10 jobs" in h.reasons[0] and "link checks" not in h.reasons[0]


def test_what_a_slower_network_cost_is_its_longest_transfer_less_the_median_hosts_speed() -> None:
    t = FleetTally()
    transfer = np.array([0.2, 0.05, 0.1, 0.04, 0.03])  # the ring, then the pairs (s per frame)
    for _ in range(10):
        t.add(np.ones(4), 1.0, RING_SHAPE, _links(ratios(RING_SHAPE, 2, 1.25)), transfer)
    r2, r0 = t.link_reading("h2"), t.link_reading("h0")
    assert r2 is not None and r0 is not None
    # h2's longest transfer is the ring's 0.2 s a frame: 1 - 1/1.25 of it lost, 10 frames
    assert math.isclose(r2.lost_s, 10 * 0.2 * 0.2) and r0.lost_s == 0.0


def test_a_nics_speed_cost_is_its_measured_loss_at_the_credible_slowness() -> None:
    model = FleetModel().links()
    h = Health(slowness=1.25, low=1.1, observed_s=1000.0)
    jobs = [JobReading(100, math.log(1.25), 0.0, 500.0, lost_s=4.0)] * 2
    check = JobReading(1, math.log(1.25), 0.0, 0.0)  # a link check costs no job time
    assert math.isclose(speed_cost(h, [*jobs, check], model, 1.25), 8.0)
    assert math.isclose(speed_cost(h, jobs, model, 1.1), 8.0 * (1 - 1 / 1.1) / 0.2)
    assert speed_cost(h, jobs, model, 1.0) == 0.0
    # a GPU or host: its excess share of the time it ran
    assert math.isclose(speed_cost(h, jobs, FleetModel(), 1.1), 1000.0 * (1 - 1 / 1.1))
