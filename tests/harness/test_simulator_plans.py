"""The simulator follows plans: shares, re-created rings, restarts without a host."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from failslow.harness.simulator import Fault, Layout, Scenario
from failslow.harness.simulator.engine import Simulation
from failslow.harness.simulator.model import Noise, Workload

LAY = Layout(tp=1, pp=1, dp=4, gpus_per_host=1)  # 4 hosts, one rank each, one dp ring


def _records(sim: Simulation, until: float) -> list[tuple[int, tuple[Any, ...]]]:
    sim.run_until(until)
    return sim.drain(until)


def test_shares_change_each_replicas_compute_from_the_boundary() -> None:
    sim = Simulation(LAY, steps=20, workload=Workload(microbatches=4), noise=Noise.none())
    sim.run_until(1.0)
    start = sim.apply_plan(version=1, shares=(1, 5, 5, 5))
    assert start >= 2  # a few steps ran before the plan arrived
    sim.run_until(60.0)
    steps: dict[int, dict[int, float]] = defaultdict(dict)
    for _, rec in sim.drain(60.0):
        if rec[0] == "s":
            steps[rec[2]][rec[1]] = (rec[4] - rec[3]) / 1e9
    before = steps[start - 1]
    after = steps[start + 1]
    assert before[0] == pytest.approx(before[1], rel=1e-6)  # equal shares, no noise: equal
    # step time is the slowest replica's: 5 micro-batches vs 4 before
    assert after[0] > before[0] * 1.15


def test_a_new_ring_order_recreates_the_comm_and_avoids_the_slow_pair() -> None:
    slow = Fault("slow_link", 0, factor=10.0, hosts=("node-000", "node-001"))
    sim = Simulation(LAY, steps=30, noise=Noise.none(), faults=(slow,))
    sim.run_until(2.0)
    start = sim.apply_plan(version=3, rank_order={"dp-0-0": (0, 2, 1, 3)})
    assert "dp-0-0@v3" in {c.comm for c in sim.comms()}
    sim.run_until(100.0)
    by_comm: dict[str, list[float]] = defaultdict(list)
    for _, rec in sim.drain(100.0):
        if rec[0] == "c" and rec[1] == 0:
            by_comm[rec[2]].append((rec[7] - rec[6]) / 1e9)
    assert by_comm["dp-0-0@v3"] and by_comm["dp-0-0"]
    assert max(by_comm["dp-0-0@v3"]) < min(by_comm["dp-0-0"]) / 2  # the 10x link is avoided
    assert start > 0


def test_a_bad_rank_order_is_refused() -> None:
    sim = Simulation(LAY, steps=3, noise=Noise.none())
    with pytest.raises(ValueError, match="permutation"):
        sim.apply_plan(version=1, rank_order={"dp-0-0": (0, 1, 2, 2)})
    with pytest.raises(ValueError, match="shares"):
        sim.apply_plan(version=1, shares=(1, 2))


def test_restart_unsticks_a_hang_without_the_isolated_host() -> None:
    sc = Scenario(layout=LAY, steps=40, noise=Noise.none(), faults=(Fault("hang", 5, ranks=(2,)),))
    sim = sc.simulation()
    sim.run_until(30.0)
    assert sim.stalled
    resume = sim.apply_plan(
        version=2, excluded_hosts=("node-002",), restart_epoch=1, restart_s=10.0
    )
    sim.run_until(400.0)
    steps = sorted({rec[2] for _, rec in sim.drain(400.0) if rec[0] == "s"})
    assert steps[-1] == 39 and resume in steps
    assert sim.restarts == [(30.0, resume)]
