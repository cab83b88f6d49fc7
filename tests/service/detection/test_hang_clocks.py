"""Hosts whose clocks disagree by seconds (no NTP, a bad step): a record's times are its host's.

The hang detector compared each rank's last completion, on its host's clock, with the job's
"now", on the clock of the host furthest ahead: a rank of a host 2-8 s behind looked quiet for
2-8 s more than it was, and the healthy neighbour of a stuck rank was named the hang's root
(seed 3, clocks within +-2 s and within +-8 s). Each host's times are now moved on by how far
behind the job's "now" its envelopes always arrive (``HostCadence.offsets_ns``)."""

from __future__ import annotations

import pytest

from failslow.harness.simulator import Fault, Layout, Scenario
from failslow.harness.simulator.model import Noise
from tests.simrun import run

L16 = Layout(tp=2, pp=2, dp=4, gpus_per_host=4)
APART = Noise(clock_offset_s=4.0)  # each host's clock offset drawn from U(-4 s, 4 s)


def scenario(fault: Fault | None, seed: int, noise: Noise) -> Scenario:
    return Scenario(
        job="clocks", layout=L16, steps=55, seed=seed, batch_s=0.5, hang_tail_s=12.0,
        faults=(fault,) if fault else (), noise=noise, vouch=False,
    )  # fmt: skip


def roots(fault: Fault | None, seed: int, noise: Noise = APART) -> list[tuple[str, list[int]]]:
    r = run(scenario(fault, seed, noise))
    slot_rank = r.state.topology.slot_rank
    return [(f.kind.value, [slot_rank[s] for s in f.slots]) for _, f in r.opened(None)]


@pytest.mark.parametrize("seed", [1, 3])
def test_a_stuck_rank_is_the_root_whatever_the_clocks_of_its_neighbours(seed: int) -> None:
    assert roots(Fault("hang", 30, ranks=(10,)), seed) == [("hang", [10])]


def test_a_dead_host_is_the_root_and_hosts_behind_it_are_not() -> None:
    assert roots(Fault("dead_host", 30, hosts=("node-001",)), 3) == [("hang", [4, 5, 6, 7])]


def test_clocks_seconds_apart_open_nothing_in_a_healthy_job() -> None:
    assert roots(None, 3) == []


def test_a_straggler_is_no_hang_whatever_the_clocks() -> None:
    """A 5x straggler (rank 9) with clocks within +-1 s and hiccups: its peers' waits looked up
    to 2 s longer, and ranks 12 and 14 were named a hang three times."""
    noise = Noise(clock_offset_s=1.0, hiccup_prob=0.01)
    assert roots(Fault("slow_gpu", 30, factor=5.0, ranks=(9,)), 4, noise) == [("slow_gpu", [9])]
