"""Run a simulated scenario through the real ingest state and detection pipeline, in-process."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from failslow.detectors.pipeline import Finding, JobPipeline
from failslow.harness.simulator import Scenario
from failslow.service.ingest.envelope import parse_envelope
from failslow.service.settings import DetectionSettings, StateSettings
from failslow.service.stream.shape import (
    blocked_before_ns,
    blocked_collectives,
    hang_snapshot,
    job_shape,
)
from failslow.service.stream.state import JobState


@dataclass
class Run:
    findings: list[tuple[int, Finding]]  # (rank, finding)
    frames: int
    state: JobState
    pipeline: JobPipeline
    labels: dict[str, Any]  # the scenario's ground truth (fault onsets in event time)
    found_ns: list[int]  # per finding: the job's event time at the pass that made it

    def opened(self, kind: str | None = "slow_gpu") -> list[tuple[int, Finding]]:
        return [
            (r, f)
            for r, f in self.findings
            if f.status == "opened" and (kind is None or f.kind == kind)
        ]

    def onset(self, kind: str, subject: str) -> int | None:
        """The onset step of the condition as last reported (openings are re-dated later)."""
        latest = [f for _, f in self.findings if f.kind == kind and f.subject == subject]
        return latest[-1].onset_index if latest else None

    def resolved(self) -> list[tuple[int, Finding]]:
        return [(r, f) for r, f in self.findings if f.status == "resolved"]


def run(
    scenario: Scenario, *, strip_steps: bool = False, detection: DetectionSettings | None = None
) -> Run:
    d = detection or DetectionSettings()
    state = JobState(scenario.job, StateSettings())
    pipe = JobPipeline(
        late_fraction=d.late_fraction,
        compute_ratio=d.compute_ratio,
        window=d.window,
        open_after=d.open_after,
        resolve_after=d.resolve_after,
        warmup_frames=d.warmup_frames,
        baseline_frames=d.baseline_frames,
    )
    findings: list[tuple[int, Finding]] = []
    found_ns: list[int] = []
    frames = 0

    def drain(flush: bool = False) -> None:
        nonlocal frames
        state.drain_ready()
        closed = state.frames.advance(
            state.watermark_ns, state.topology.n_slots, flush=flush, world=state.topology.world_size
        )
        shape = job_shape(state.topology)
        topo = state.topology
        for fr in closed:
            frames += 1
            for f in pipe.process(fr, shape):
                findings.append((topo.slot_rank[f.slots[0]] if f.slots else -1, f))
        # the engine's hang check, every pass
        blocked = blocked_collectives(
            state,
            older_than_ns=blocked_before_ns(state, d.hang_timeout_floor_s),
            typical=pipe.comm_typical,
        )
        step_time_s = float(pipe.job_view()["step_time_s"] or float("nan"))
        snap = hang_snapshot(state, blocked, step_time_s=step_time_s)
        slot_of = {r: i for i, r in enumerate(topo.slot_rank)}
        for f in pipe.check_hang(snap, slot_of):
            findings.append((topo.slot_rank[f.slots[0]] if f.slots else -1, f))
        found_ns.extend([state.watermark_ns] * (len(findings) - len(found_ns)))

    sim = scenario.simulation() if isinstance(scenario, Scenario) else None
    envelopes = scenario.envelopes(sim) if sim is not None else scenario.envelopes()
    for env in envelopes:
        if strip_steps:
            env["steps"] = []
        result = state.apply(parse_envelope(env))
        assert not result.rejected, result.rejected[:3]
        drain()
    drain(flush=True)
    labels = scenario.labels(sim) if sim is not None else {}  # a replayed trace has none
    return Run(findings, frames, state, pipe, labels, found_ns)
