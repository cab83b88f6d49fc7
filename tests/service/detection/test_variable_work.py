"""Data-dependent step time (issue 16): each data-parallel replica's batch has its own number of
tokens (lognormal, sigma 0.25, correlated 0.9 from step to step, as length-bucketed sampling
gives a replica long batches for a while); its ranks compute and are late in proportion. With
the work in the step records, compute is compared per unit of work and the job's step time at
its usual work: nothing opens, and a 1.2x GPU is still found. Without it, the replicas with long
batches are blamed (``slow_node`` here: a host's ranks all look slow)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from failslow.harness.simulator import Fault, Layout, Scenario
from failslow.harness.simulator.model import Noise
from tests.simrun import run

LAYOUT = Layout(tp=2, pp=1, dp=8, gpus_per_host=4)
WORK = Noise(work_spread=0.25, work_corr=0.9)


class WithoutWork:
    """The same envelopes, as an SDK that does not report work would send them."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario, self.job = scenario, scenario.job

    def envelopes(self) -> Iterator[dict[str, Any]]:
        for env in self.scenario.envelopes():
            for s in env["steps"]:
                s.pop("work", None)
            yield env


def test_variable_work_opens_nothing_when_reported_and_is_blamed_when_not() -> None:
    sc = Scenario("work", LAYOUT, steps=150, seed=0, noise=WORK)
    assert run(sc).opened(None) == []
    blamed = run(WithoutWork(sc)).opened(None)  # type: ignore[arg-type]
    assert blamed and {f.kind for _, f in blamed} <= {"slow_gpu", "slow_node", "job_slowdown"}


def test_a_slow_gpu_is_found_under_variable_work() -> None:
    fault = Fault("slow_gpu", 60, factor=1.2, ranks=(10,))
    r = run(Scenario("work", LAYOUT, steps=110, seed=1, noise=WORK, faults=(fault,)))
    opened = [(rank, f.kind, f.onset_index) for rank, f in r.opened(None)]
    assert len(opened) == 1 and opened[0][:2] == (10, "slow_gpu"), opened
    assert 60 <= opened[0][2] <= 66
