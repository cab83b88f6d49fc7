"""The evaluation harness's own pieces: metrics, real-trace conversion, baselines, bound."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bench.eval import baselines
from bench.eval.tcpd_metrics import cover, f1
from tests.helpers import SHARED

DATASETS = SHARED / "datasets"
needs_shared = pytest.mark.skipif(not DATASETS.exists(), reason=f"{DATASETS} not present")


@needs_shared
def test_tcpd_metrics_reproduce_every_published_default_score() -> None:
    root = DATASETS / "tcpd"
    locs = json.loads((root / "published" / "default_experiment_cplocations.json").read_text())
    pf1 = json.loads((root / "published" / "scores" / "default_f1_scores.json").read_text())
    pcv = json.loads((root / "published" / "scores" / "default_cover_scores.json").read_text())
    ann = json.loads((root / "annotations.json").read_text())
    checked = 0
    for series, methods in locs.items():
        path = root / "datasets" / f"{series}.json"
        if series not in ann or not path.exists():
            continue
        n = json.loads(path.read_text())["n_obs"]
        for method, run in methods.items():
            if run["cplocations_raw"] is None or pf1[series].get(method) is None:
                continue
            assert f1(ann[series], run["cplocations_raw"], n) == pytest.approx(
                pf1[series][method], abs=1e-12
            )
            assert cover(ann[series], run["cplocations_raw"], n) == pytest.approx(
                pcv[series][method], abs=1e-12
            )
            checked += 1
    assert checked == 431


@needs_shared
@pytest.mark.parametrize("trace", ["AR", "ST", "SE"])
def test_osdi_traces_through_the_pipeline(trace: str) -> None:
    pytest.importorskip("pyarrow")
    from bench.eval.osdi import judge, to_envelopes
    from failslow.detectors.pipeline import JobPipeline
    from failslow.service.ingest.envelope import parse_envelope
    from failslow.service.settings import DetectionSettings, StateSettings
    from failslow.service.stream.shape import job_shape
    from failslow.service.stream.state import JobState

    d = DetectionSettings()
    state = JobState(trace, StateSettings())
    pipe = JobPipeline(late_fraction=d.late_fraction, compute_ratio=d.compute_ratio)
    opened = []
    for env in to_envelopes(DATASETS / "stragglers-osdi25", trace):
        assert not state.apply(parse_envelope(env)).rejected
        state.drain_ready()
        for fr in state.frames.advance(
            state.watermark_ns, state.topology.n_slots, world=state.topology.world_size
        ):
            for f in pipe.process(fr, job_shape(state.topology)):
                if f.status == "opened":
                    opened.append(
                        {"kind": f.kind, "ranks": [state.topology.slot_rank[s] for s in f.slots]}
                    )
    assert judge(trace, opened)["pass"], opened


def test_baselines_on_a_step_series() -> None:
    steps = np.arange(100)
    times = np.r_[np.full(50, 1.0), np.full(50, 1.5)]
    assert baselines.prometheus_rule(steps, times) == [(52, ())]
    falcon = [s for s, _ in baselines.falcon_trigger(steps, times)]
    assert 50 <= falcon[0] <= 52 and all(
        b - a >= 10 for a, b in zip(falcon, falcon[1:], strict=False)
    )
    ranks = np.arange(4)
    compute = np.ones((4, 100))
    compute[2, 50:] = 2.0
    alarms = baselines.nvidia_straggler(ranks, steps, compute)
    assert alarms[0] == (54, (2,))


def test_cusum_bound() -> None:
    # shift of one sigma, ARL 1000: log(1000) / 0.5 samples
    assert baselines.cusum_delay_bound(1.0, 1.0, 1000) == pytest.approx(2 * math.log(1000))
    assert math.isnan(baselines.cusum_delay_bound(0.0, 1.0, 1000))


def _inc(kind: str, ranks: list[int], hosts: list[str], onset: int | None, det: int) -> dict:  # type: ignore[type-arg]
    ns = 1_000_000_000
    return {"kind": kind, "ranks": ranks, "hosts": hosts, "state": "open", "onset_step": onset,
            "detected_step": det, "detected_ns": det * ns, "resolved_ns": None}  # fmt: skip


def test_concurrent_and_chronic_cases_are_scored_on_placement_and_onset() -> None:
    from bench.eval import concurrent, suite
    from bench.eval.scoring import score_case

    ns = 1_000_000_000
    cases = {c.name: c for c in suite.cases(quick=True, seeds=1)}
    pair = cases["concurrent-gpu-then-nic-64r-s0"]
    labels = {"faults": [dict(f.label(), onset_ns=f.start_step * ns, end_ns=None)
                         for f in pair.scenario.faults]}  # fmt: skip
    right = [_inc("slow_gpu", [9], ["node-001"], 60, 63),
             _inc("slow_link", [], ["node-005"], 100, 103)]  # fmt: skip
    scored = score_case(pair, labels, right)
    assert scored.localized and scored.delay_steps == 3 and scored.false_incidents == 0
    # the second fault dated at the first one's onset: found, not placed right in time
    misdated = [right[0], _inc("slow_link", [], ["node-005"], 60, 103)]
    assert not score_case(pair, labels, misdated).localized
    # the NIC blamed on the wrong host: missed, and a false incident
    wrong = [right[0], _inc("slow_link", [], ["node-001"], 100, 103)]
    s = score_case(pair, labels, wrong)
    assert not s.localized and s.false_incidents == 1

    chronic = cases["chronic-32r-s0"]
    clabels = {"faults": [f.label() for f in chronic.scenario.faults]}
    since_start = [_inc("slow_gpu", [3], ["node-000"], 0, 77)]
    assert score_case(chronic, clabels, since_start).false_incidents == 0
    invented = [_inc("slow_gpu", [3], ["node-000"], 74, 77)]  # the peers' change as its onset
    s = score_case(chronic, clabels, invented)
    assert s.false_incidents == 1 and not s.localized
    assert concurrent.is_chronic(chronic.family)


def test_a_hang_delay_is_counted_in_the_jobs_step_times_before_it() -> None:
    """A hang has no detected step: its delay in steps is its delay in seconds over the job's
    mean step time before the onset (issue 32 asks for hangs in steps)."""
    from bench.eval import suite
    from bench.eval.scoring import score_case

    ns = 1_000_000_000
    case = next(c for c in suite.cases(quick=True, seeds=1) if c.name.startswith("stuck-rank"))
    (fault,) = case.scenario.faults
    start = fault.start_step
    onset = 10 * ns + start * ns // 2  # 0.5 s steps from t0 = 10 s
    hosts = [case.scenario.layout.host(fault.ranks[0])]
    label = dict(fault.label(), onset_ns=onset, end_ns=None, hosts=hosts)
    labels = {"t0_ns": 10 * ns, "faults": [label]}
    hang = _inc("hang", list(fault.ranks), hosts, None, 0)
    hang.update(detected_step=None, detected_ns=onset + 3 * ns // 2)  # 1.5 s later
    scored = score_case(case, labels, [hang])
    assert scored.localized and scored.delay_s == 1.5 and scored.delay_steps == 3.0


def test_the_other_layout_places_its_faults_where_it_says() -> None:
    """bench/eval/layouts.py: stage s on node-(2s), node-(2s+1); the cables join adjacent
    stages' hosts (pipeline sends cross them); every pair and single case, each seed."""
    from bench.eval import layouts

    lay = layouts.LAYOUT
    assert lay.n_hosts == 8 and lay.world == 32
    assert [lay.host(r) for r in (5, 22, 27)] == ["node-001", "node-005", "node-006"]
    assert [lay.coords(r)[2] for r in (5, 22, 27)] == [0, 2, 3]
    for pair in (layouts.FIRST["pair"], layouts.SECOND["pair"]):
        a, b = (int(h[-3:]) for h in pair.hosts)
        assert b // 2 == a // 2 + 1  # adjacent stages
    cases = layouts.cases(2, plain=True)
    assert len(cases) == 2 * (4 * 5 + 5) and len({c.name for c in cases}) == len(cases)
    assert all(not c.scenario.vouch and c.scenario.batch_s == 0.5 for c in cases)
