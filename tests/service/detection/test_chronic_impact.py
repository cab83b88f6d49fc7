"""Chronic slowness is called chronic, and what a culprit costs is its share of the job's step
time (issue 32, items 3 and 4).

Before: three ranks 8-15% slower than the rest from the first step were reported, once the others
got 10% faster at step 74, as a new ``slow_gpu`` "since step 74"; the cost of a culprit was the
time its peers waited for it against the typical peer, which in a pipeline hides most of it (the
OSDI'25 trace AR's 2.4x stage-0 rank: "job step time +5%" where the paper's what-if analysis says
+97%) and, with another slow rank in the job, also holds that one's share.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from bench.eval.concurrent import CHRONIC, EPISODE
from failslow.detectors.chronic import chronic
from failslow.detectors.vocab import FindingStatus, IncidentKind, Severity
from failslow.harness.simulator import Fault, Layout, Scenario
from failslow.service.detection.text import summary_for
from tests.simrun import run

LAYOUT = Layout(tp=1, pp=1, dp=16, gpus_per_host=4)


def step_time(scenario: Scenario, lo: int, hi: int) -> float:
    """The job's median step time over steps [lo, hi), from the simulator's own step records."""
    per_step: dict[int, list[float]] = defaultdict(list)
    for env in scenario.envelopes():
        for s in env.get("steps") or []:
            if lo <= s["step"] < hi:
                per_step[s["step"]].append((s["end_ns"] - s["start_ns"]) / 1e9)
    return float(np.median([np.median(v) for v in per_step.values()]))


@pytest.mark.parametrize("seed", [0, 1])
def test_a_rank_slow_since_the_start_is_chronic_not_new(seed: int) -> None:
    r = run(Scenario(job="chronic", layout=LAYOUT, steps=160, faults=CHRONIC, seed=seed))
    opened = [(rank, f) for rank, f in r.opened() if rank == 3]
    assert opened, [(rank, f.reason) for rank, f in r.opened()]
    _, f = opened[0]
    assert f.evidence.get("chronic") is True
    assert f.onset_index == 0  # its first frame, not the step the others got faster
    text = summary_for(f, [3], ["node-000"], {})
    assert "since the job began" in text and "since step 74" not in text
    # its cost is what it adds beyond the next slowest rank (1.035 vs 1.12 of the old speed):
    # about 8%, not the 24% it stands above the typical peer
    cost = f.evidence["attributed_slowdown"]
    assert 1.02 <= cost <= 1.15, cost
    assert f.severity in (Severity.MINOR, Severity.MAJOR)


def test_a_fault_that_starts_later_keeps_its_onset() -> None:
    faults = (Fault("slow_gpu", 60, factor=1.5, ranks=(6,)),)
    r = run(Scenario(job="new", layout=LAYOUT, steps=120, faults=faults, seed=0))
    f = next(f for rank, f in r.opened() if rank == 6)
    assert not f.evidence.get("chronic") and 58 <= f.onset_index <= 62


@pytest.mark.parametrize("seed", [1, 2])
def test_a_straggler_episode_costs_what_the_job_pays_for_it(seed: int) -> None:
    """A rank 2x slow for 14 steps, the slowest of the job: the step time follows it."""
    with_it = Scenario(job="ep", layout=LAYOUT, steps=160, faults=(*CHRONIC, EPISODE), seed=seed)
    without = Scenario(job="ep", layout=LAYOUT, steps=160, faults=CHRONIC, seed=seed)
    truth = step_time(with_it, 121, 134) / step_time(without, 121, 134)
    r = run(with_it)
    found = [f for rank, f in r.findings if rank == 5 and f.kind == IncidentKind.SLOW_GPU]
    assert found
    opened = found[0]
    assert abs(opened.evidence["attributed_slowdown"] - truth) <= 0.1 * truth
    assert opened.severity == Severity.CRITICAL  # >= 1.5x: the policy acts
    resolved = [f for f in found if f.status == FindingStatus.RESOLVED]
    # the resolution says what the episode cost, not the recovered frames it is decided on
    assert resolved and resolved[-1].evidence["attributed_slowdown"] >= 0.9 * truth


def test_chronic_needs_the_first_frames_slow_and_no_worse_now() -> None:
    early = np.array([[1.10, 1.12, 1.08, 1.11, 1.09]], dtype=np.float32)
    none = np.zeros((1, 5), dtype=bool)
    assert chronic(early, none, 5, 1.13, 1.05)
    assert not chronic(early, none, 5, 1.60, 1.05)  # much slower now: a new fault
    healthy_first = early.copy()
    healthy_first[0, 0] = 1.0
    assert not chronic(healthy_first, none, 5, 1.13, 1.05)
    assert not chronic(early, none, 2, 1.13, 1.05)  # too few early frames to say


OSDI = Path(__file__).resolve().parents[3].parent / "shared/datasets/stragglers-osdi25"


@pytest.mark.skipif(not OSDI.is_dir(), reason="needs ../shared/datasets/stragglers-osdi25")
def test_the_real_megatron_straggler_costs_most_of_the_step() -> None:
    """OSDI'25 trace AR: rank 0 computes ~2.4x its peers in a 4-stage pipeline; the paper's
    what-if replay says the job runs 1.97x what it would without it."""
    pytest.importorskip("pyarrow")
    from bench.eval import osdi
    from failslow.detectors.pipeline import JobPipeline
    from failslow.service.ingest.envelope import parse_envelope
    from failslow.service.settings import StateSettings
    from failslow.service.stream.shape import job_shape
    from failslow.service.stream.state import JobState

    state = JobState("osdi-AR", StateSettings())
    pipe = JobPipeline()
    found = []
    for env in osdi.to_envelopes(OSDI, "AR"):
        state.apply(parse_envelope(env))
        state.drain_ready()
        for fr in state.frames.advance(state.watermark_ns, state.topology.n_slots):
            found += pipe.process(fr, job_shape(state.topology))
    gpu = [f for f in found if f.kind == IncidentKind.SLOW_GPU]
    assert gpu and gpu[0].slots == (0,)
    cost = gpu[-1].evidence["attributed_slowdown"]
    assert 1.6 <= cost <= 2.7, cost  # was 1.05 (lateness against the typical peer)
    assert gpu[-1].severity == Severity.CRITICAL
